from __future__ import annotations

import math
import re
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from feature_repo import synthetic
from feature_repo.synthetic import (
    AGE_GROUPS,
    CATEGORIES,
    SyntheticConfig,
    SyntheticData,
    generate,
    read_transactions,
    write,
)

SMALL = SyntheticConfig(n_customers=300, n_merchants=60, days=21, seed=11)

UTC_NS = pd.DatetimeTZDtype(unit="ns", tz="UTC")
INT = np.dtype("int64")
FLOAT = np.dtype("float64")
STR = "str"

CUSTOMER_SCHEMA = {"customer_id": INT, "age_group": STR, "home_region": STR, "signup_ts": UTC_NS}
MERCHANT_SCHEMA = {"merchant_id": INT, "category": STR}
TRANSACTION_SCHEMA = {
    "transaction_id": INT,
    "event_timestamp": UTC_NS,
    "customer_id": INT,
    "merchant_id": INT,
    "amount": FLOAT,
    "channel": STR,
    "is_fraud": INT,
    "label_available_ts": UTC_NS,
}


@pytest.fixture(scope="module")
def data() -> SyntheticData:
    return generate(SMALL)


@pytest.fixture(scope="module")
def txns(data: SyntheticData) -> pd.DataFrame:
    return data.transactions


def _assert_schema(frame: pd.DataFrame, schema: dict[str, object]) -> None:
    assert list(frame.columns) == list(schema)
    for column, expected in schema.items():
        if expected == STR:
            assert frame[column].dtype == object, column
            assert frame[column].map(type).eq(str).all(), column
        else:
            assert frame[column].dtype == expected, (column, frame[column].dtype)


def _assert_data_equal(left: SyntheticData, right: SyntheticData) -> None:
    pd.testing.assert_frame_equal(left.customers, right.customers)
    pd.testing.assert_frame_equal(left.merchants, right.merchants)
    pd.testing.assert_frame_equal(left.transactions, right.transactions)


# --- determinism ----------------------------------------------------------------


def test_same_seed_gives_identical_frames(data: SyntheticData) -> None:
    _assert_data_equal(generate(SMALL), data)


def test_different_seed_gives_different_frames(data: SyntheticData) -> None:
    other = generate(replace(SMALL, seed=SMALL.seed + 1))
    assert not other.transactions.equals(data.transactions)
    assert not other.customers.equals(data.customers)


# --- schema and invariants ---------------------------------------------------------


def test_schemas_and_dtypes(data: SyntheticData) -> None:
    _assert_schema(data.customers, CUSTOMER_SCHEMA)
    _assert_schema(data.merchants, MERCHANT_SCHEMA)
    _assert_schema(data.transactions, TRANSACTION_SCHEMA)


def test_customers(data: SyntheticData) -> None:
    customers = data.customers
    assert customers["customer_id"].tolist() == list(range(1, SMALL.n_customers + 1))
    assert set(customers["age_group"]) == set(AGE_GROUPS)
    assert 2 <= customers["home_region"].nunique() <= 8
    assert (customers["signup_ts"] < pd.Timestamp(SMALL.start)).all()


def test_merchants(data: SyntheticData) -> None:
    merchants = data.merchants
    assert merchants["merchant_id"].tolist() == list(range(1, SMALL.n_merchants + 1))
    assert set(merchants["category"]) <= set(CATEGORIES)
    assert merchants["category"].nunique() >= 5


def test_transaction_ids_and_time_order(txns: pd.DataFrame) -> None:
    ids = txns["transaction_id"].to_numpy()
    assert ids[0] == 1
    assert (np.diff(ids) > 0).all()
    assert txns["transaction_id"].is_unique
    assert txns["event_timestamp"].is_monotonic_increasing
    start = pd.Timestamp(SMALL.start)
    assert txns["event_timestamp"].min() >= start
    assert txns["event_timestamp"].max() < start + pd.Timedelta(days=SMALL.days)
    # roughly mean_txns_per_customer_day per customer and day
    expected = SMALL.n_customers * SMALL.days * SMALL.mean_txns_per_customer_day
    assert 0.8 * expected <= len(txns) <= 1.3 * expected


def test_transaction_values(data: SyntheticData, txns: pd.DataFrame) -> None:
    assert set(txns["customer_id"]) <= set(data.customers["customer_id"])
    assert set(txns["merchant_id"]) <= set(data.merchants["merchant_id"])
    amount = txns["amount"].to_numpy()
    assert (amount > 0).all()
    np.testing.assert_allclose(amount * 100, np.round(amount * 100), atol=1e-6)
    assert 20 <= float(np.median(amount)) <= 80
    assert set(txns["channel"]) == {"online", "in_store"}
    assert set(txns["is_fraud"]) == {0, 1}


def test_label_delay_between_1_and_14_days(txns: pd.DataFrame) -> None:
    delay = txns["label_available_ts"] - txns["event_timestamp"]
    assert delay.min() >= pd.Timedelta(days=1)
    assert delay.max() <= pd.Timedelta(days=14)
    assert delay.median() < pd.Timedelta(days=7)


def test_label_delay_does_not_leak_the_label(txns: pd.DataFrame) -> None:
    delay_days = (txns["label_available_ts"] - txns["event_timestamp"]).dt.total_seconds() / 86_400
    by_label = delay_days.groupby(txns["is_fraud"]).mean()
    assert abs(by_label[1] - by_label[0]) < 0.5


def test_positive_rate(txns: pd.DataFrame) -> None:
    assert 0.01 <= txns["is_fraud"].mean() <= 0.06


def test_age_group_does_not_determine_fraud(data: SyntheticData, txns: pd.DataFrame) -> None:
    age = txns["customer_id"].map(data.customers.set_index("customer_id")["age_group"])
    overall = txns["is_fraud"].mean()
    by_age = txns["is_fraud"].groupby(age).mean()
    assert set(by_age.index) == set(AGE_GROUPS)
    assert (by_age.between(overall / 3, overall * 3)).all(), by_age.to_dict()


# --- the fraud signal is measurable from observable columns -----------------------------


def _count_in_preceding_hour(txns: pd.DataFrame) -> pd.Series:
    """Per transaction: the same customer's transactions in [t - 1h, t)."""
    ordered = txns.sort_values(["customer_id", "transaction_id"])
    rolled = (
        ordered.groupby("customer_id", sort=True)
        .rolling("1h", on="event_timestamp", closed="left")["transaction_id"]
        .count()
    )
    # rows come back grouped by customer, i.e. in the order of `ordered`
    counts = pd.Series(rolled.to_numpy(), index=ordered.index)
    return counts.reindex(txns.index).fillna(0)


def test_velocity_signal(txns: pd.DataFrame) -> None:
    overall = txns["is_fraud"].mean()
    fast = _count_in_preceding_hour(txns) >= 3
    assert fast.sum() >= 30
    assert txns.loc[fast, "is_fraud"].mean() >= 3 * overall


def test_merchant_risk_signal_generalises_to_later_period(txns: pd.DataFrame) -> None:
    middle = pd.Timestamp(SMALL.start) + pd.Timedelta(days=SMALL.days / 2)
    first = txns[txns["event_timestamp"] < middle]
    second = txns[txns["event_timestamp"] >= middle]
    merchant_rate = first.groupby("merchant_id")["is_fraud"].mean()
    n_top = max(1, math.ceil(0.05 * len(merchant_rate)))
    top = merchant_rate.sort_values(ascending=False, kind="stable").index[:n_top]
    at_top = second["merchant_id"].isin(top)
    assert at_top.sum() >= 30
    top_rate = second.loc[at_top, "is_fraud"].mean()
    other_rate = second.loc[~at_top, "is_fraud"].mean()
    assert top_rate > other_rate
    assert top_rate >= 2 * other_rate


def test_amount_relative_to_habit_signal(txns: pd.DataFrame) -> None:
    overall = txns["is_fraud"].mean()
    customer_median = txns.groupby("customer_id")["amount"].transform("median")
    large = txns["amount"] > 3 * customer_median
    assert large.sum() >= 30
    assert txns.loc[large, "is_fraud"].mean() >= 3 * overall


# --- config validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n_customers", 0),
        ("n_merchants", -3),
        ("days", 0),
        ("mean_txns_per_customer_day", 0.0),
        ("mean_txns_per_customer_day", -1.5),
        ("mean_txns_per_customer_day", float("nan")),
    ],
)
def test_bad_config_raises_naming_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be > 0, got {re.escape(repr(value))}$"):
        SyntheticConfig(**{field: value})  # type: ignore[arg-type]


def test_naive_start_rejected() -> None:
    with pytest.raises(ValueError, match=r"^start must be a timezone-aware"):
        SyntheticConfig(start=datetime(2026, 9, 1))


def test_non_utc_start_is_accepted_and_normalised() -> None:
    start = datetime(2026, 9, 1, 2, tzinfo=timezone(timedelta(hours=2)))
    data = generate(SyntheticConfig(n_customers=20, n_merchants=10, days=3, start=start))
    assert data.transactions["event_timestamp"].min() >= pd.Timestamp("2026-09-01T00:00Z")
    assert data.transactions["event_timestamp"].dt.tz is not None


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        SMALL.seed = 3  # type: ignore[misc]


# --- persistence -----------------------------------------------------------------------


def test_write_then_read_round_trips(data: SyntheticData, tmp_path: Path) -> None:
    folder = tmp_path / "nested" / "out"
    paths = write(data, folder)
    assert set(paths) == {"customers", "merchants", "transactions"}
    assert paths["transactions"] == folder / "transactions.parquet"
    pd.testing.assert_frame_equal(pd.read_parquet(paths["customers"]), data.customers)
    pd.testing.assert_frame_equal(pd.read_parquet(paths["merchants"]), data.merchants)
    pd.testing.assert_frame_equal(read_transactions(folder), data.transactions)
    assert sorted(p.name for p in folder.iterdir()) == [
        "customers.parquet",
        "merchants.parquet",
        "transactions.parquet",
    ]


def test_write_overwrites_existing_files(data: SyntheticData, tmp_path: Path) -> None:
    small = generate(SyntheticConfig(n_customers=10, n_merchants=5, days=2))
    write(small, tmp_path)
    write(data, tmp_path)
    pd.testing.assert_frame_equal(read_transactions(tmp_path), data.transactions)
    assert len(list(tmp_path.iterdir())) == 3


def test_read_transactions_missing_file(tmp_path: Path) -> None:
    expected = tmp_path / "transactions.parquet"
    with pytest.raises(FileNotFoundError, match=re.escape(str(expected))) as info:
        read_transactions(tmp_path)
    assert "python -m feature_repo.synthetic --out" in str(info.value)


def test_cli_writes_files(tmp_path: Path) -> None:
    out = tmp_path / "cli"
    argv = ["--out", str(out), "--customers", "30", "--merchants", "10", "--days", "3"]
    code = synthetic.main(argv)
    assert code == 0
    txns = read_transactions(out)
    assert len(txns) > 0
    assert txns["customer_id"].max() <= 30


def test_cli_rejects_bad_config(tmp_path: Path) -> None:
    assert synthetic.main(["--out", str(tmp_path / "x"), "--customers", "0"]) == 2
    assert not (tmp_path / "x").exists()
