"""Point-in-time correctness through Feast itself, and definitions checked before anything is written."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from feature_repo import aggregations, synthetic
from feature_repo import store as feature_store
from flows import training

SERVICE = "fraud_v1"


def _store_for(home, transactions, customers, merchants):
    tables = aggregations.feature_tables(transactions, customers["customer_id"], merchants["merchant_id"])
    for name, frame in tables.items():
        feature_store.write_table(home, name, frame)
    store = feature_store.open_store(home, feature_store.OnlineStoreChoice("sqlite"))
    feature_store.apply_definitions(store)
    return store


def test_a_later_event_or_label_never_changes_earlier_training_rows(world, tmp_path):
    data = world.settings.data_dir
    tx = synthetic.read_transactions(data)
    customers = pd.read_parquet(data / "customers.parquet")
    merchants = pd.read_parquet(data / "merchants.parquet")
    cutoff = tx["event_timestamp"].quantile(0.6)
    # a transaction before the cutoff whose label is only revealed a day or more after it
    late_label = tx[(tx["event_timestamp"] < cutoff) & (tx["label_available_ts"] > cutoff + pd.Timedelta(days=1))].iloc[
        -1
    ]
    customer, merchant = late_label["customer_id"], late_label["merchant_id"]
    rows = tx[
        ((tx["customer_id"] == customer) | (tx["merchant_id"] == merchant)) & (tx["event_timestamp"] < cutoff)
    ].tail(40)
    entities = training.entity_frame(rows)
    base = training.historical_features(_store_for(tmp_path / "a", tx, customers, merchants), SERVICE, entities)

    changed_tx = tx.copy()
    # the late label flips, and a big event happens after the cutoff for the same customer and merchant
    changed_tx.loc[changed_tx["transaction_id"] == late_label["transaction_id"], "is_fraud"] = (
        1 - late_label["is_fraud"]
    )
    extra = tx[tx["transaction_id"] == late_label["transaction_id"]].assign(
        transaction_id=tx["transaction_id"].max() + 1, event_timestamp=cutoff + pd.Timedelta(minutes=5), amount=9_999.0
    )
    changed_tx = pd.concat([changed_tx, extra], ignore_index=True)
    changed_store = _store_for(tmp_path / "b", changed_tx, customers, merchants)
    pd.testing.assert_frame_equal(base, training.historical_features(changed_store, SERVICE, entities))

    # the same changes are visible once they have happened: the check is not vacuous
    later = pd.DataFrame(
        {
            "transaction_id": [1, 2],
            "customer_id": [customer, customer],
            "merchant_id": [merchant, merchant],
            "amount": [10.0, 10.0],
            "event_timestamp": [
                cutoff + pd.Timedelta(minutes=10),
                late_label["label_available_ts"].ceil("D") + pd.Timedelta(hours=1),
            ],
        }
    )
    later["event_timestamp"] = pd.to_datetime(later["event_timestamp"], utc=True).dt.floor("us")
    a = training.historical_features(_store_for(tmp_path / "c", tx, customers, merchants), SERVICE, later)
    b = training.historical_features(changed_store, SERVICE, later)
    assert b["cust_spend_1h"].iloc[0] >= a["cust_spend_1h"].iloc[0] + 9_999.0 - 1e-6
    assert b["merch_fraud_rate_30d"].iloc[1] != a["merch_fraud_rate_30d"].iloc[1]


def test_a_view_whose_table_lacks_a_column_is_refused_before_registering(world, tmp_path):
    home = tmp_path / "home"
    table = pd.read_parquet(world.home / feature_store.TABLE_PATHS["customer_activity"]).drop(columns=["cust_spend_7d"])
    feature_store.write_table(home, "customer_activity", table)
    feature_store.write_table(
        home, "merchant_risk", pd.read_parquet(world.home / feature_store.TABLE_PATHS["merchant_risk"])
    )
    store = feature_store.open_store(home, feature_store.OnlineStoreChoice("sqlite"))
    with pytest.raises(ValueError, match=r"customer_activity.*cust_spend_7d"):
        feature_store.apply_definitions(store)
    assert not (home / "feast" / "registry.db").exists()


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda f: f.drop(columns=["merchant_id"]), "merchant_id"),
        (lambda f: f.drop(columns=["event_timestamp"]), "event_timestamp"),
        (lambda f: f.assign(amount=f["amount"].astype(str)), "amount"),
    ],
)
def test_bad_entity_rows_name_the_column(world, mutate, named):
    tx = synthetic.read_transactions(world.settings.data_dir).head(5)
    store = feature_store.open_store(world.home)
    with pytest.raises(ValueError, match=named):
        training.historical_features(store, SERVICE, mutate(training.entity_frame(tx)))


def test_every_view_is_served_by_the_versioned_service(world):
    store = feature_store.open_store(world.home)
    service = feature_store.feature_service(store, SERVICE)
    views = {p.name for p in service.feature_view_projections}
    assert views == {"customer_activity", "merchant_risk", "transaction_context"}
    assert np.all([f.startswith(("cust_", "merch_", "amount_", "log_")) for f in feature_store.feature_names(service)])


def test_feature_tables_are_stored_by_key_range_and_join_the_same_as_in_time_order(world, tmp_path, monkeypatch):
    """Tables are written sorted by entity key then time, in row groups of disjoint key ranges (what lets
    DuckDB skip row groups in a point-in-time join); the features Feast joins are the same as from a
    table stored in time order."""
    import pyarrow.parquet as pq

    monkeypatch.setattr(feature_store, "TABLE_ROW_GROUP_ROWS", 500)  # several row groups at this world's size
    data = world.settings.data_dir
    tx = synthetic.read_transactions(data)
    customers = pd.read_parquet(data / "customers.parquet")
    merchants = pd.read_parquet(data / "merchants.parquet")
    store = _store_for(tmp_path / "sorted", tx, customers, merchants)

    for name, key in (("customer_activity", "customer_id"), ("merchant_risk", "merchant_id")):
        meta = pq.ParquetFile(tmp_path / "sorted" / feature_store.TABLE_PATHS[name]).metadata
        assert meta.num_row_groups > 2, name
        column = meta.schema.to_arrow_schema().get_field_index(key)
        ranges = [
            (meta.row_group(i).column(column).statistics.min, meta.row_group(i).column(column).statistics.max)
            for i in range(meta.num_row_groups)
        ]
        # consecutive row groups share at most their boundary key: each covers a narrow key range
        assert all(prev[1] <= cur[0] for prev, cur in itertools.pairwise(ranges)), (name, ranges[:5])
        frame = pd.read_parquet(tmp_path / "sorted" / feature_store.TABLE_PATHS[name])
        assert frame.equals(frame.sort_values(feature_store.table_order(name), kind="stable", ignore_index=True))

    # the same tables written in time order (what the writer did before), read by a store of their own
    home = tmp_path / "time-order"
    tables = aggregations.feature_tables(tx, customers["customer_id"], merchants["merchant_id"])
    for name, frame in tables.items():
        path = home / feature_store.TABLE_PATHS[name]
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.sort_values("feature_ts", kind="stable").to_parquet(path, index=False)
    time_ordered = feature_store.open_store(home, feature_store.OnlineStoreChoice("sqlite"))
    feature_store.apply_definitions(time_ordered)  # each registry holds its own home's absolute paths

    entities = training.entity_frame(tx.sample(2_000, random_state=5))

    def joined(s):
        frame = s.get_historical_features(
            entity_df=entities, features=feature_store.feature_service(s, SERVICE)
        ).to_df()
        return frame.sort_values("transaction_id", ignore_index=True)[sorted(frame.columns)]

    got, want = joined(store), joined(time_ordered)
    assert len(got) == len(entities) and got["cust_spend_7d"].notna().mean() > 0.5
    pd.testing.assert_frame_equal(got, want)


def test_retrieval_with_on_demand_views_fed_only_their_inputs_equals_feasts_own(world, tmp_path):
    """``retrieval.historical_features`` (batch scoring's join: Feast joins the batch views, each on-demand
    view's transform runs on its declared inputs only) returns what Feast's own ``get_historical_features``
    returns for the service: the same columns and values, short and full feature names, and for a service
    that projects a subset of a view and of the on-demand view's features."""
    from feast import FeatureService

    from feature_repo import retrieval
    from feature_repo.features import customer_activity, merchant_risk
    from feature_repo.on_demand_features import transaction_context

    data = world.settings.data_dir
    tx = synthetic.read_transactions(data)
    store = _store_for(
        tmp_path / "home", tx, pd.read_parquet(data / "customers.parquet"), pd.read_parquet(data / "merchants.parquet")
    )
    subset = FeatureService(
        name="fraud_subset",
        features=[customer_activity[["cust_spend_1h"]], merchant_risk, transaction_context[["log_amount"]]],
    )
    store.apply([subset])
    entities = training.entity_frame(tx.sample(3_000, random_state=11))
    for name in (SERVICE, "fraud_subset"):
        service = feature_store.feature_service(store, name)
        for full in (False, True):
            want = store.get_historical_features(entity_df=entities, features=service, full_feature_names=full).to_df()
            got = retrieval.historical_features(store, service, entities, full_feature_names=full)
            assert sorted(got.columns) == sorted(want.columns), (name, full)
            assert (
                got.filter(like="log_amount").notna().all().all()
                and got.filter(like="log_amount").nunique().min() > 100
            )

            def ordered(frame):
                return frame.sort_values("transaction_id", ignore_index=True)[sorted(frame.columns)]

            pd.testing.assert_frame_equal(ordered(got), ordered(want), check_exact=True)
    # the subset service still gets the on-demand view's source features it does not list (Feast returns them)
    assert (
        "cust_mean_amount_7d"
        in retrieval.historical_features(
            store, feature_store.feature_service(store, "fraud_subset"), entities.head(10)
        ).columns
    )


def test_retrieval_names_a_missing_request_field_of_an_on_demand_view(world):
    from feature_repo import retrieval

    store = feature_store.open_store(world.home)
    entities = training.entity_frame(synthetic.read_transactions(world.settings.data_dir).head(5)).drop(
        columns=["amount"]
    )
    with pytest.raises(ValueError, match=r"transaction_context.*request field 'amount'"):
        retrieval.historical_features(store, feature_store.feature_service(store, SERVICE), entities)
