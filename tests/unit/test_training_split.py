from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from flows.training import TimeSplit, split_rows

T0 = datetime(2026, 9, 1, tzinfo=UTC)


def frame(days: int) -> pd.DataFrame:
    ts = pd.date_range(T0, periods=days * 24, freq="h", tz="UTC")
    return pd.DataFrame({"event_timestamp": ts, "label_available_ts": ts + pd.Timedelta(days=3), "is_fraud": 0})


def test_split_keeps_only_labels_known_at_the_cutoff_and_orders_slices():
    split = TimeSplit.for_span(T0, T0 + timedelta(days=42))
    train, evaluation = split_rows(frame(42), split)
    assert train["event_timestamp"].max() < evaluation["event_timestamp"].min()
    assert (evaluation["label_available_ts"] <= pd.Timestamp(split.as_of)).all()
    assert train["event_timestamp"].min() >= pd.Timestamp(T0 + timedelta(days=7))


def test_a_span_too_short_is_refused_with_the_counts():
    with pytest.raises(ValueError, match="train_start < eval_start"):
        TimeSplit.for_span(T0, T0 + timedelta(days=20))
    split = TimeSplit(T0, T0 + timedelta(days=1), T0 + timedelta(days=2), T0 + timedelta(days=30))
    with pytest.raises(ValueError, match="0 training and 0 evaluation rows"):
        split_rows(frame(42).iloc[0:0], split)
