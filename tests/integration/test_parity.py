"""Zero training-serving skew, measured: the serving path's features equal Feast's offline features at
the same time, on the SQLite online store and on a real Redis."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from feature_repo import store as feature_store
from feature_repo import synthetic
from flows import training
from monitoring.parity import compare_features
from serving.features.reader import OnlineFeatureReader
from tests.services import redis_server

SERVICE = "fraud_v1"


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


def _store(world, kind: str, redis_url: str | None):
    if kind == "sqlite":
        return feature_store.open_store(world.home, feature_store.OnlineStoreChoice("sqlite"))
    store = feature_store.open_store(world.home, feature_store.OnlineStoreChoice("redis", redis_url))
    feature_store.apply_definitions(store)
    tables = {n: pd.read_parquet(world.home / p, columns=["feature_ts"]) for n, p in feature_store.TABLE_PATHS.items()}
    start = min(t["feature_ts"].min() for t in tables.values()).to_pydatetime()
    store.materialize(start_date=start, end_date=datetime.now(UTC))
    return store


def _sample(world, n: int, seed: int) -> pd.DataFrame:
    tx = synthetic.read_transactions(world.settings.data_dir)
    return tx.sample(n, random_state=seed)[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_serving_features_equal_offline_features(world, redis_url, kind):
    store = _store(world, kind, redis_url)
    rows = _sample(world, 200, seed=7)
    reader = OnlineFeatureReader(store, SERVICE)
    served = reader.read(rows)
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    entities = rows.assign(event_timestamp=now, transaction_id=np.arange(len(rows)))
    offline = training.historical_features(store, SERVICE, entities)
    names = list(reader.layout.feature_names)
    result = compare_features(served, offline[names], names)
    assert result.rows == 200
    assert result.mismatched() == [], result.table()


def test_a_serving_side_transform_bug_is_caught_and_named(world):
    store = _store(world, "sqlite", None)
    rows = _sample(world, 50, seed=8)
    reader = OnlineFeatureReader(store, SERVICE)
    served = reader.read(rows)
    served["amount_to_mean_7d"] = served["amount_to_mean_7d"] * 1.001  # a "small" bug: 0.1 %
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    offline = training.historical_features(
        store, SERVICE, rows.assign(event_timestamp=now, transaction_id=np.arange(50))
    )
    result = compare_features(served, offline[list(reader.layout.feature_names)], list(reader.layout.feature_names))
    assert result.mismatched() == ["amount_to_mean_7d"]
    assert next(f for f in result.features if f.feature == "amount_to_mean_7d").rate == 1.0
