from __future__ import annotations

import pandas as pd
import pytest

from feature_repo import aggregations

T0 = pd.Timestamp("2026-09-01 00:00", tz="UTC")


def tx(rows: list[tuple[int, int, str, float, int, str]]) -> pd.DataFrame:
    """rows: (customer, merchant, offset, amount, is_fraud, label delay)."""
    frame = pd.DataFrame(rows, columns=["customer_id", "merchant_id", "offset", "amount", "is_fraud", "delay"])
    frame["event_timestamp"] = T0 + pd.to_timedelta(frame["offset"])
    frame["label_available_ts"] = frame["event_timestamp"] + pd.to_timedelta(frame["delay"])
    return frame.drop(columns=["offset", "delay"])


def activity_at(table: pd.DataFrame, customer: int, when: pd.Timestamp) -> pd.Series:
    """What a point-in-time join returns: the latest row visible at ``when``."""
    rows = table[(table["customer_id"] == customer) & (table["feature_ts"] <= when)]
    return rows.sort_values("feature_ts").iloc[-1]


def test_windows_count_only_events_inside_them():
    events = tx(
        [
            (1, 1, "10h", 10.0, 0, "2D"),
            (1, 1, "10h30min", 20.0, 0, "2D"),
            (1, 1, "12h", 40.0, 0, "2D"),
            (2, 1, "11h", 5.0, 0, "2D"),
        ]
    )
    table = aggregations.customer_activity_table(events, pd.Series([1, 2]), T0, T0 + pd.Timedelta(days=2))
    row = activity_at(table, 1, T0 + pd.Timedelta("12h") + pd.Timedelta(seconds=5))
    assert row["cust_txn_count_1h"] == 1 and row["cust_spend_1h"] == pytest.approx(40.0)
    assert row["cust_txn_count_24h"] == 3 and row["cust_spend_24h"] == pytest.approx(70.0)
    assert row["cust_mean_amount_7d"] == pytest.approx(70.0 / 3)
    # the next midnight's snapshot lets the 1 h window decay to zero
    midnight = activity_at(table, 1, T0 + pd.Timedelta(days=1))
    assert midnight["cust_txn_count_1h"] == 0 and midnight["cust_txn_count_24h"] == 3


def test_a_transaction_does_not_see_itself():
    events = tx([(1, 1, "10h", 10.0, 0, "2D"), (1, 1, "11h", 99.0, 0, "2D")])
    table = aggregations.customer_activity_table(events, pd.Series([1]), T0, T0 + pd.Timedelta(days=1))
    at_second = activity_at(table, 1, T0 + pd.Timedelta("11h"))
    assert at_second["cust_txn_count_24h"] == 1 and at_second["cust_spend_24h"] == pytest.approx(10.0)


def test_every_customer_has_a_snapshot_from_the_first_midnight():
    events = tx([(1, 1, "10h", 10.0, 0, "2D")])
    table = aggregations.customer_activity_table(events, pd.Series([1, 2, 3]), T0, T0 + pd.Timedelta(days=3))
    quiet = table[table["customer_id"] == 3]
    assert len(quiet) == 4 and (quiet["cust_txn_count_7d"] == 0).all()
    assert quiet["feature_ts"].min() == T0


def test_merchant_rate_counts_only_labels_known_at_the_snapshot():
    events = tx([(1, 7, "1h", 10.0, 1, "3D"), (2, 7, "2h", 10.0, 0, "1h")])
    table = aggregations.merchant_risk_table(events, pd.Series([7]), T0, T0 + pd.Timedelta(days=5))
    day1 = table[table["feature_ts"] == T0 + pd.Timedelta(days=1)].iloc[0]
    day4 = table[table["feature_ts"] == T0 + pd.Timedelta(days=4)].iloc[0]
    prior = aggregations.PRIOR_RATE * aggregations.PRIOR_WEIGHT
    assert day1["merch_fraud_rate_30d"] == pytest.approx(prior / (1 + aggregations.PRIOR_WEIGHT))
    assert day4["merch_fraud_rate_30d"] == pytest.approx((1 + prior) / (2 + aggregations.PRIOR_WEIGHT))
    assert day1["merch_txn_count_30d"] == 2


def test_moving_a_label_past_the_cutoff_changes_no_earlier_snapshot():
    base = tx([(1, 7, "1h", 10.0, 1, "1D"), (2, 7, "2h", 10.0, 0, "1D"), (3, 7, "30h", 10.0, 1, "1D")])
    late = base.copy()
    late.loc[0, "label_available_ts"] = T0 + pd.Timedelta(days=9)
    end = T0 + pd.Timedelta(days=10)
    a = aggregations.merchant_risk_table(base, pd.Series([7]), T0, end)
    b = aggregations.merchant_risk_table(late, pd.Series([7]), T0, end)
    cutoff = T0 + pd.Timedelta(days=1)  # label known at day 1 in base, day 9 in late
    before = a["feature_ts"] < cutoff
    pd.testing.assert_frame_equal(a[before], b[before])
    assert not a[a["feature_ts"] == cutoff + pd.Timedelta(days=1)].equals(
        b[b["feature_ts"] == cutoff + pd.Timedelta(days=1)]
    )


def test_an_event_after_a_row_time_does_not_change_its_features():
    events = tx([(1, 1, "10h", 10.0, 0, "2D")])
    later = pd.concat([events, tx([(1, 1, "20h", 500.0, 1, "2D")])], ignore_index=True)
    end = T0 + pd.Timedelta(days=2)
    when = T0 + pd.Timedelta("15h")
    a = activity_at(aggregations.customer_activity_table(events, pd.Series([1]), T0, end), 1, when)
    b = activity_at(aggregations.customer_activity_table(later, pd.Series([1]), T0, end), 1, when)
    pd.testing.assert_series_equal(a, b)


def test_missing_columns_are_named():
    with pytest.raises(ValueError, match="label_available_ts"):
        aggregations.feature_tables(
            pd.DataFrame(
                {"customer_id": [1], "merchant_id": [1], "event_timestamp": [T0], "amount": [1.0], "is_fraud": [0]}
            ),
            pd.Series([1]),
            pd.Series([1]),
        )
