"""The training-set suite on a realistic frame: it passes clean data and names each injected fault."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flows.data_validation import ExpectationOutcome, ValidationSummary, training_suite, validate_frame

FEATURES = [
    "cust_spend_1h",
    "cust_txn_count_1h",
    "cust_spend_24h",
    "cust_txn_count_24h",
    "cust_spend_7d",
    "cust_txn_count_7d",
    "cust_mean_amount_7d",
    "merch_fraud_rate_30d",
    "merch_txn_count_30d",
    "amount_to_mean_7d",
    "log_amount",
]
NOT_NULL = "expect_column_values_to_not_be_null"
BETWEEN = "expect_column_values_to_be_between"
IN_SET = "expect_column_values_to_be_in_set"
UNIQUE = "expect_column_values_to_be_unique"
ROW_COUNT = "expect_table_row_count_to_be_between"
MEAN = "expect_column_mean_to_be_between"


def make_frame(n: int = 2000, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    amount = np.round(rng.lognormal(3.5, 1.0, n), 2) + 0.01
    spend_1h, spend_24h, spend_7d = (amount * rng.uniform(0, k, n) for k in (1, 5, 30))
    count_1h, count_24h, count_7d = (rng.poisson(lam, n) for lam in (0.5, 3, 20))
    mean_7d = amount * rng.uniform(0.5, 2.0, n)
    fraud = (rng.random(n) < 0.03).astype(np.int64)
    fraud[::100] = 1  # at least one positive in every slice used here
    return pd.DataFrame(
        {
            "transaction_id": np.arange(1, n + 1, dtype=np.int64),
            "customer_id": rng.integers(1, 500, n),
            "merchant_id": rng.integers(1, 80, n),
            "event_timestamp": pd.Timestamp("2025-01-01", tz="UTC")
            + pd.to_timedelta(np.sort(rng.integers(0, 30 * 86400, n)), "s"),
            "amount": amount,
            "cust_spend_1h": spend_1h,
            "cust_txn_count_1h": count_1h,
            "cust_spend_24h": spend_24h,
            "cust_txn_count_24h": count_24h,
            "cust_spend_7d": spend_7d,
            "cust_txn_count_7d": count_7d,
            "cust_mean_amount_7d": mean_7d,
            "merch_fraud_rate_30d": rng.beta(1, 60, n),
            "merch_txn_count_30d": rng.poisson(300, n),
            "amount_to_mean_7d": amount / mean_7d,
            "log_amount": np.log1p(amount),
            "is_fraud": fraud,
            "age_group": rng.choice(["18-25", "26-40", "41-60", "61+"], n),
        }
    )


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return make_frame()


def failed_keys(summary: ValidationSummary) -> set[tuple[str, str | None]]:
    return {(o.expectation, o.column) for o in summary.failed()}


def test_clean_frame_passes(frame: pd.DataFrame) -> None:
    summary = validate_frame(frame, FEATURES)
    suite = training_suite(FEATURES)
    assert summary.success
    assert summary.evaluated == len(suite) == summary.successful == len(summary.outcomes)
    assert summary.rows == 2000 and summary.failed() == []
    assert all(o.success for o in summary.outcomes)
    keys = {(o.expectation, o.column) for o in summary.outcomes}
    assert {
        (ROW_COUNT, None),
        (IN_SET, "is_fraud"),
        (MEAN, "is_fraud"),
        (UNIQUE, "transaction_id"),
        (BETWEEN, "amount"),
        (BETWEEN, "merch_fraud_rate_30d"),
        (BETWEEN, "cust_txn_count_7d"),
        (IN_SET, "age_group"),
        (NOT_NULL, "event_timestamp"),
    } <= keys
    assert {(NOT_NULL, c) for c in [*FEATURES, "is_fraud", "transaction_id"]} <= keys
    assert len(keys) == len(summary.outcomes)  # one outcome per (type, column)
    assert next(o for o in summary.outcomes if o.expectation == ROW_COUNT).observed == "observed 2000"


def test_nulls_in_one_feature_fail_only_that_column(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[bad.index[:30], "cust_spend_24h"] = np.nan
    summary = validate_frame(bad, FEATURES)
    assert not summary.success
    assert summary.failed() == [ExpectationOutcome(NOT_NULL, "cust_spend_24h", False, "30 of 2000 unexpected (1.5%)")]
    assert summary.successful == summary.evaluated - 1


def test_negative_amount_fails_amount_expectation_without_leaking_the_value(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[5, "amount"] = -123.456
    summary = validate_frame(bad, FEATURES)
    assert failed_keys(summary) == {(BETWEEN, "amount")}
    assert all("123.456" not in o.observed for o in summary.outcomes)
    assert summary.failed()[0].observed.startswith("1 of 2000 unexpected")


def test_zero_amount_fails_strictly_positive(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[9, "amount"] = 0.0
    assert failed_keys(validate_frame(bad, FEATURES)) == {(BETWEEN, "amount")}


def test_label_outside_zero_one_fails_label_set(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[3, "is_fraud"] = 2
    assert failed_keys(validate_frame(bad, FEATURES)) == {(IN_SET, "is_fraud")}


def test_label_mean_out_of_range_fails_mean(frame: pd.DataFrame) -> None:
    bad = frame.assign(is_fraud=0)
    summary = validate_frame(bad, FEATURES)
    assert failed_keys(summary) == {(MEAN, "is_fraud")}
    assert summary.failed()[0].observed == "observed 0"


def test_duplicated_transaction_id_fails_uniqueness(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[1, "transaction_id"] = bad.loc[0, "transaction_id"]
    assert failed_keys(validate_frame(bad, FEATURES)) == {(UNIQUE, "transaction_id")}


def test_out_of_range_rate_and_negative_count_fail(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[4, "merch_fraud_rate_30d"] = 1.5
    bad.loc[6, "cust_txn_count_1h"] = -1
    assert failed_keys(validate_frame(bad, FEATURES)) == {
        (BETWEEN, "merch_fraud_rate_30d"),
        (BETWEEN, "cust_txn_count_1h"),
    }


def test_too_few_rows_fails_row_count(frame: pd.DataFrame) -> None:
    summary = validate_frame(frame.head(500), FEATURES)
    assert failed_keys(summary) == {(ROW_COUNT, None)}
    assert summary.failed()[0].observed == "observed 500"
    assert validate_frame(frame.head(500), FEATURES, min_rows=500).success


def test_missing_feature_column_fails_naming_it(frame: pd.DataFrame) -> None:
    summary = validate_frame(frame.drop(columns=["merch_txn_count_30d"]), FEATURES)
    assert not summary.success
    assert failed_keys(summary) == {(NOT_NULL, "merch_txn_count_30d"), (BETWEEN, "merch_txn_count_30d")}
    assert {o.observed for o in summary.failed()} == {"column missing"}
    assert "merch_txn_count_30d" in summary.as_tags()["gx.failed"]


def test_unknown_age_group_fails_and_absent_age_group_is_not_checked(frame: pd.DataFrame) -> None:
    bad = frame.copy()
    bad.loc[2, "age_group"] = "90+"
    assert failed_keys(validate_frame(bad, FEATURES)) == {(IN_SET, "age_group")}
    without = validate_frame(frame.drop(columns=["age_group"]), FEATURES)
    assert without.success
    assert all(o.column != "age_group" for o in without.outcomes)
    assert without.evaluated == len(training_suite(FEATURES)) - 1


def test_tags_are_strings_and_report_failure(frame: pd.DataFrame) -> None:
    good = validate_frame(frame, FEATURES, suite_name="nightly").as_tags()
    assert good["gx.success"] == "true" and good["gx.suite"] == "nightly" and good["gx.failed"] == ""
    assert good["gx.evaluated"] == str(len(training_suite(FEATURES)))
    bad = frame.copy()
    bad.loc[0, "amount"] = -1.0
    tags = validate_frame(bad, FEATURES).as_tags()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in tags.items())
    assert tags["gx.success"] == "false"
    assert tags["gx.failed"] == "expect_column_values_to_be_between(amount)"


def test_tags_are_truncated_to_500_chars(frame: pd.DataFrame) -> None:
    many = [*FEATURES, *(f"absent_feature_number_{i}" for i in range(40))]
    summary = validate_frame(frame, many)
    assert len(summary.failed()) == 40
    tags = summary.as_tags()
    assert all(len(v) <= 500 for v in tags.values())
    assert tags["gx.failed"].endswith("...") and tags["gx.failed"].startswith(f"{NOT_NULL}(absent_feature_number_0)")


def test_table_rows_match_outcomes(frame: pd.DataFrame) -> None:
    summary = validate_frame(frame, FEATURES)
    rows = summary.table()
    assert len(rows) == summary.evaluated
    assert set(rows[0]) == {"expectation", "column", "success", "observed"}
    assert rows[0] == {"expectation": ROW_COUNT, "column": "", "success": True, "observed": "observed 2000"}


def test_no_progress_bar_on_stderr(frame: pd.DataFrame, capfd: pytest.CaptureFixture[str]) -> None:
    capfd.readouterr()
    validate_frame(frame, FEATURES)
    bad = frame.copy()
    bad.loc[0, "amount"] = -1.0
    validate_frame(bad, FEATURES)
    err = capfd.readouterr().err
    assert "it/s" not in err and "Calculating Metrics" not in err
