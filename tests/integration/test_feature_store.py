"""Feast on its real SQLite online store and DuckDB offline store, fed by the materialize flow."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from feature_repo import store as feature_store
from feature_repo import synthetic
from flows import training
from serving.features.reader import OnlineFeatureReader
from serving.protocol.errors import ApiError

SERVICE = "fraud_v1"


@pytest.fixture(scope="module")
def store(world):
    return feature_store.open_store(world.home)


def test_training_set_keeps_every_entity_row_point_in_time(world, store):
    tx = synthetic.read_transactions(world.settings.data_dir).sample(400, random_state=1)
    entities = training.entity_frame(tx)
    frame = training.historical_features(store, SERVICE, entities)
    assert len(frame) == len(entities)
    assert list(frame["transaction_id"]) == list(entities["transaction_id"])
    # point in time: the customer's own table, latest row visible at the transaction time
    table = pd.read_parquet(world.home / feature_store.TABLE_PATHS["customer_activity"])
    for _, row in frame.head(40).iterrows():
        visible = table[(table["customer_id"] == row["customer_id"]) & (table["feature_ts"] <= row["event_timestamp"])]
        expected = visible.sort_values("feature_ts").iloc[-1]
        assert row["cust_spend_24h"] == pytest.approx(expected["cust_spend_24h"], rel=1e-9)
        assert row["cust_txn_count_7d"] == expected["cust_txn_count_7d"]


def test_online_features_equal_offline_features_at_the_same_time(world, store):
    tx = synthetic.read_transactions(world.settings.data_dir)
    rows = tx.drop_duplicates("customer_id").head(30)[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)
    reader = OnlineFeatureReader(store, SERVICE)
    online = reader.read(rows)
    now = datetime.now(UTC)
    entities = rows.assign(event_timestamp=pd.Timestamp(now).floor("us"), transaction_id=np.arange(len(rows)))
    offline = training.historical_features(store, SERVICE, entities)
    for name in reader.layout.feature_names:
        a, b = online[name].to_numpy(dtype=float), offline[name].to_numpy(dtype=float)
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)


def test_materializing_twice_changes_nothing(world, store):
    from flows.materialize import materialize

    rows = pd.DataFrame({"customer_id": [1, 2, 3], "merchant_id": [1, 2, 3], "amount": [10.0, 20.0, 30.0]})
    before = OnlineFeatureReader(store, SERVICE).read(rows)
    again = materialize()
    after = OnlineFeatureReader(feature_store.open_store(world.home), SERVICE).read(rows)
    pd.testing.assert_frame_equal(before, after)
    assert again["rows"] == world.materialized["rows"]


def test_unknown_entity_is_refused_naming_it(store):
    reader = OnlineFeatureReader(store, SERVICE)
    rows = pd.DataFrame({"customer_id": [1, 10**9], "merchant_id": [1, 1], "amount": [5.0, 5.0]})
    with pytest.raises(ApiError) as err:
        reader.read(rows)
    assert err.value.status_code == 404
    assert "customer_id" in err.value.message and "row 1" in err.value.message


@pytest.mark.parametrize(
    ("rows", "field"),
    [
        ({"customer_id": [1], "merchant_id": [1]}, "amount"),
        ({"customer_id": [1], "amount": [3.0]}, "merchant_id"),
        ({"customer_id": [1], "merchant_id": [1], "amount": ["lots"]}, "amount"),
        ({"customer_id": [1.5], "merchant_id": [1], "amount": [3.0]}, "customer_id"),
    ],
)
def test_bad_request_rows_name_the_field(store, rows, field):
    with pytest.raises(ApiError) as err:
        OnlineFeatureReader(store, SERVICE).read(pd.DataFrame(rows))
    assert err.value.status_code == 400
    assert field in err.value.message
    assert "lots" not in err.value.message
