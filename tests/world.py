"""One small, real world shared by the integration and e2e tests: data, features, a trained model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from serving.settings import Settings

# Long enough for a 7-day warm-up, a training week, a 7-day evaluation slice and a 14-day label horizon.
WORLD_CUSTOMERS = 600
WORLD_MERCHANTS = 100
WORLD_DAYS = 36
MODEL_NAME = "fraud"


@dataclass(frozen=True)
class World:
    settings: Settings
    materialized: dict[str, Any]
    trained: dict[str, Any]

    @property
    def home(self) -> Path:
        return self.settings.home


def build_world() -> World:
    from feature_repo import synthetic
    from flows.materialize import materialize
    from flows.train import train

    settings = Settings.from_environ(os.environ)
    # the data ends today, as a live system's would: features at "now" are inside their TTL
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=WORLD_DAYS)
    config = synthetic.SyntheticConfig(
        n_customers=WORLD_CUSTOMERS, n_merchants=WORLD_MERCHANTS, days=WORLD_DAYS, seed=11, start=start
    )
    synthetic.write(synthetic.generate(config), settings.data_dir)
    materialized = materialize()
    trained = train(model_name=MODEL_NAME, alias="champion")
    return World(settings, materialized, trained)


def two_days_of_transactions(world: World, path: Path, columns: list[str]) -> Path:
    """Two days of the world's transactions (two date partitions), from five days before the data's end,
    written to ``path`` with ``columns``: the batch-scoring tests' input."""
    import pandas as pd

    from feature_repo import synthetic

    tx = synthetic.read_transactions(world.settings.data_dir)
    day = tx["event_timestamp"].max().floor("D") - pd.Timedelta(days=5)
    rows = tx[(tx["event_timestamp"] >= day) & (tx["event_timestamp"] < day + pd.Timedelta(days=2))]
    rows[columns].to_parquet(path, index=False)
    return path
