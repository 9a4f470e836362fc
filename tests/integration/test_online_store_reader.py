"""The fast online path equals Feast's ``get_online_features`` path, on SQLite and on a real Redis.

The fast path reads Feast's storage layout directly (``serving.features.store_reader``) and runs the
on-demand views through Feast's stored transformations; these tests hold it to Feast, frame for frame,
and check it steps aside for any store it does not know.
"""

from __future__ import annotations

import string
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
import yaml
from feast import FeatureStore, RepoConfig
from feast.on_demand_feature_view import OnDemandFeatureView

from feature_repo import store as feature_store
from feature_repo import synthetic
from serving.features import store_reader as online_store_reader
from serving.features.reader import OnlineFeatureReader
from serving.features.store_reader import UnsupportedOnlineStore, ViewSpec, open_online_store_reader
from serving.protocol.errors import ApiError
from tests.services import redis_server

SERVICE = "fraud_v1"
KINDS = ["sqlite", "redis"]


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


@pytest.fixture(scope="module")
def stores(world, redis_url) -> dict[str, FeatureStore]:
    """The world's SQLite store, and the same definitions materialized into a fresh Redis."""
    redis = feature_store.open_store(world.home, feature_store.OnlineStoreChoice("redis", redis_url))
    feature_store.apply_definitions(redis)
    tables = {n: pd.read_parquet(world.home / p, columns=["feature_ts"]) for n, p in feature_store.TABLE_PATHS.items()}
    start = min(t["feature_ts"].min() for t in tables.values()).to_pydatetime()
    redis.materialize(start_date=start, end_date=datetime.now(UTC))
    return {"sqlite": feature_store.open_store(world.home, feature_store.OnlineStoreChoice("sqlite")), "redis": redis}


@pytest.fixture(scope="module")
def request_rows(world) -> pd.DataFrame:
    """300 real transactions' keys and amounts: ids that exist, repeats included."""
    tx = synthetic.read_transactions(world.settings.data_dir)
    return tx.sample(300, random_state=17)[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)


def _readers(store: FeatureStore) -> tuple[OnlineFeatureReader, OnlineFeatureReader]:
    fast, feast_path = OnlineFeatureReader(store, SERVICE), OnlineFeatureReader(store, SERVICE, fast=False)
    assert fast.fast and not feast_path.fast
    return fast, feast_path


def assert_same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    """Same columns, dtypes and rows; ints and strings exact, floats within 1e-9 relative."""
    assert list(got.columns) == list(want.columns)
    assert got.dtypes.to_dict() == want.dtypes.to_dict()
    assert len(got) == len(want)
    for name in want.columns:
        if pd.api.types.is_float_dtype(want[name]):
            np.testing.assert_allclose(got[name].to_numpy(), want[name].to_numpy(), rtol=1e-9, atol=0, err_msg=name)
        else:
            assert got[name].tolist() == want[name].tolist(), name


def _batches(rows: pd.DataFrame, size: int) -> list[pd.DataFrame]:
    return [rows.iloc[i : i + size].reset_index(drop=True) for i in range(0, len(rows), size)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [1, 64, 300])
def test_fast_frame_equals_feast_frame(stores, request_rows, kind, size):
    fast, feast_path = _readers(stores[kind])
    for batch in _batches(request_rows, size):
        assert_same_frame(fast.read(batch), feast_path.read(batch))


@pytest.mark.parametrize("kind", KINDS)
def test_store_reader_equals_get_online_features_per_view(stores, request_rows, kind):
    store = stores[kind]
    reader = OnlineFeatureReader(store, SERVICE)._fast.store_reader
    columns = {k: [*request_rows[k].tolist(), 10**9] for k in ("customer_id", "merchant_id")}  # last: unknown
    got = reader.read(columns)
    for spec in reader.views:
        refs = [f"{spec.name}:{f}" for f in spec.features]
        want = store.get_online_features(features=refs, entity_rows=columns).to_dict(include_event_timestamps=True)
        rows = got[spec.name]
        for name in spec.features:
            assert rows.values[name] == want[name], name
            assert rows.values[name][-1] is None
        stamps = [int(ts.timestamp()) if ts is not None else 0 for ts in rows.event_timestamps]
        assert stamps == want[f"{spec.features[0]}__ts"]
        assert rows.event_timestamps[-1] is None and all(ts is not None for ts in rows.event_timestamps[:-1])


@pytest.mark.parametrize("kind", KINDS)
def test_on_demand_view_gets_what_feast_gives_it(stores, request_rows, kind, monkeypatch):
    """One transform (the registered view's), fed the same columns by both paths."""
    seen: list[dict] = []
    original = OnDemandFeatureView.transform_dict

    def spy(self, feature_dict):
        seen.append({k: list(v) for k, v in feature_dict.items()})
        return original(self, feature_dict)

    monkeypatch.setattr(OnDemandFeatureView, "transform_dict", spy)
    fast, feast_path = _readers(stores[kind])
    batch = request_rows.head(64)
    fast.read(batch)
    feast_path.read(batch)
    assert len(seen) == 2
    assert seen[0] == seen[1]
    assert "merch_fraud_rate_30d" not in seen[0]  # not a declared source of transaction_context


@pytest.mark.parametrize("kind", KINDS)
def test_unknown_entity_is_refused_naming_it(stores, kind):
    fast, _ = _readers(stores[kind])
    rows = pd.DataFrame({"customer_id": [1, 2, 10**9], "merchant_id": [1, 1, 1], "amount": [5.0, 5.0, 5.0]})
    with pytest.raises(ApiError) as err:
        fast.read(rows)
    assert err.value.status_code == 404
    assert "customer_id" in err.value.message and "row 2" in err.value.message


@pytest.mark.parametrize("kind", KINDS)
def test_bad_rows_are_refused_before_any_read(stores, kind):
    fast, _ = _readers(stores[kind])
    with pytest.raises(ApiError) as err:
        fast.read(pd.DataFrame({"customer_id": [1], "merchant_id": [1], "amount": ["lots"]}))
    assert err.value.status_code == 400 and "amount" in err.value.message


def _config(world, redis_url: str, kind: str, **changes) -> RepoConfig:
    """The repository's config for ``kind``, with top-level keys, online_store or registry keys changed."""
    text = string.Template(feature_store.CONFIG_FILES[kind].read_text()).substitute(
        TOLLFREE_HOME=str(world.home), TOLLFREE_REDIS=redis_url
    )
    data = yaml.safe_load(text)
    data["online_store"].update(changes.pop("online_store", {}))
    data["registry"].update(changes.pop("registry", {}))
    data.update(changes)
    config = RepoConfig(**data)
    config.repo_path = world.home
    return config


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize(
    ("kind", "changes", "named"),
    [
        ("sqlite", {"entity_key_serialization_version": 2}, "entity_key_serialization_version"),
        ("sqlite", {"registry": {"enable_online_feature_view_versioning": True}}, "versioning"),
        ("redis", {"online_store": {"redis_type": "redis_cluster"}}, "redis_cluster"),
        ("redis", {"online_store": {"redis_type": "redis_sentinel"}}, "redis_sentinel"),
        ("sqlite", {"online_store": {"type": "remote", "path": "http://127.0.0.1:9"}}, "remote"),
    ],
)
def test_unknown_layouts_are_refused_at_construction(world, stores, redis_url, kind, changes, named):
    view = ViewSpec.of(stores["sqlite"].get_feature_view("customer_activity"))
    config = _config(world, redis_url, kind, **changes)
    with pytest.raises(UnsupportedOnlineStore, match=named):
        open_online_store_reader(config, [view])
    assert not OnlineFeatureReader(FeatureStore(config=config, repo_path=str(world.home)), SERVICE).fast


def test_an_unsupported_store_falls_back_to_feast(stores, request_rows, monkeypatch):
    """Another Feast release: the reader steps aside, and Feast's path serves the same frame."""
    store = stores["sqlite"]
    fast_frame = OnlineFeatureReader(store, SERVICE).read(request_rows.head(64))
    monkeypatch.setattr(online_store_reader, "SUPPORTED_FEAST", "0.0.")
    with pytest.raises(UnsupportedOnlineStore, match="feast"):
        online_store_reader.check_supported(store.config)
    fallback = OnlineFeatureReader(store, SERVICE)
    assert not fallback.fast
    assert_same_frame(fallback.read(request_rows.head(64)), fast_frame)
    with pytest.raises(ApiError) as err:
        fallback.read(pd.DataFrame({"customer_id": [10**9], "merchant_id": [1], "amount": [1.0]}))
    assert err.value.status_code == 404 and "customer_id" in err.value.message
