"""Region parity flow: do two regions' online stores hold the same features for the same entities?

``python -m flows.region_parity --other-home DIR [--service fraud_v1] [--sample 200] [--other-online-store redis
--other-redis host:port]``

Each region materializes from the same offline data into its own online store. This samples entity keys from this
region's offline tables (each batch feature view's source: its join keys at random), reads the FeatureService's
stored features for them from both online stores, and compares them with ``monitoring.parity`` (floats within a
relative tolerance, the rest exactly): a mismatch rate per feature, as a Prefect table artifact and the flow's
result. On-demand features are left out: both regions compute them from the same stored features and request.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from feast import FeatureStore
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from feature_repo import store as feature_store
from monitoring.parity import ParityResult, compare_features
from serving.settings import Settings


def stored_features(store: FeatureStore, service_name: str) -> tuple[list[str], list[str], dict[str, str]]:
    """The service's features held in the online store (``view:feature``), their names, and each batch view's
    offline source path by join key."""
    service = feature_store.feature_service(store, service_name)
    refs: list[str] = []
    names: list[str] = []
    sources: dict[str, str] = {}
    for projection in service.feature_view_projections:
        try:
            view = store.get_feature_view(projection.name)
        except Exception:
            continue  # an on-demand view: computed, not stored
        refs += [f"{projection.name}:{f.name}" for f in projection.features]
        names += [f.name for f in projection.features]
        for column in view.entity_columns:
            sources.setdefault(column.name, str(view.batch_source.path))
    return refs, names, sources


def sample_keys(store: FeatureStore, sources: dict[str, str], sample: int, seed: int) -> pd.DataFrame:
    """``sample`` rows of entity keys, each key drawn from its view's offline table."""
    columns = {}
    for key, path in sources.items():
        table = Path(path) if Path(path).is_absolute() else Path(store.repo_path) / path
        values = pd.read_parquet(table, columns=[key])[key].drop_duplicates()
        columns[key] = values.sample(sample, replace=len(values) < sample, random_state=seed).to_numpy()
    return pd.DataFrame(columns)


def compare_regions(
    here: FeatureStore, there: FeatureStore, service_name: str, sample: int = 200, seed: int = 0
) -> ParityResult:
    refs, names, sources = stored_features(here, service_name)
    keys = sample_keys(here, sources, sample, seed)
    rows = keys.to_dict(orient="records")
    mine = here.get_online_features(features=refs, entity_rows=rows).to_df()
    theirs = there.get_online_features(features=refs, entity_rows=rows).to_df()
    return compare_features(mine, theirs, names)


def check_home(home: Path) -> None:
    """``ValueError`` unless ``home`` is a state folder with a feature registry (nothing is created elsewhere)."""
    if not (home / "feast").is_dir():
        raise ValueError(f"{home} is not a region's state folder: it has no feast/ (materialize there first)")


@flow(name="region-parity")
def region_parity(
    other_home: str,
    service_name: str = "fraud_v1",
    sample: int = 200,
    seed: int = 0,
    other_online_store: str = "sqlite",
    other_redis: str | None = None,
) -> list[dict[str, Any]]:
    """Mismatch rate per feature between this region's online store and the one of the region in ``other_home``."""
    check_home(Path(other_home))
    here = feature_store.open_store(Settings.from_environ(os.environ).home)
    there = feature_store.open_store(Path(other_home), feature_store.OnlineStoreChoice(other_online_store, other_redis))
    result = compare_regions(here, there, service_name, sample, seed)
    table = result.table()
    create_table_artifact(table, key="region-parity", description=f"{service_name}: {result.rows} entity rows")
    logger = get_run_logger()
    for row in table:
        logger.info(
            "%s: %d of %d differ (%.2f %%)", row["feature"], row["mismatches"], row["compared"], 100 * row["rate"]
        )
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other-home", required=True, help="the other region's state folder")
    parser.add_argument("--service", default="fraud_v1")
    parser.add_argument("--sample", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--other-online-store", default="sqlite", choices=["sqlite", "redis"])
    parser.add_argument("--other-redis", default=None)
    args = parser.parse_args(argv)
    if args.sample < 1:
        parser.error("--sample must be at least 1")
    try:
        check_home(Path(args.other_home))  # refused here, before Prefect starts a run
        table = region_parity(
            args.other_home, args.service, args.sample, args.seed, args.other_online_store, args.other_redis
        )
    except (LookupError, ValueError) as exc:
        print(f"region-parity: {exc}", file=sys.stderr)
        return 1
    for row in table:
        print(f"{row['feature']}: {row['mismatches']}/{row['compared']} differ")
    return 1 if any(row["mismatches"] for row in table) else 0


if __name__ == "__main__":
    raise SystemExit(main())
