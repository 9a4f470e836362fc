"""A version's own served traffic as its drift reference: the first served window and a pinned window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pandas as pd

from monitoring.reference import after, first_served_window, pinned_window

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def served(requests: int, every_s: float, rows_each: int = 2) -> pd.DataFrame:
    """``requests`` requests ``every_s`` apart from T0, ``rows_each`` served rows each."""
    return pd.DataFrame(
        [
            {"request_id": f"r{i}", "row": j, "timestamp": T0 + timedelta(seconds=i * every_s), "x": float(i)}
            for i in range(requests)
            for j in range(rows_each)
        ]
    )


def test_the_first_window_closes_at_its_request_count_and_what_follows_is_compared():
    rows = served(30, 1.0)
    ref = first_served_window(rows, first_requests=10, first_hours=1.0, now=T0 + timedelta(seconds=30))
    assert ref.complete and ref.requests == 10 and len(ref.rows) == 20
    assert set(ref.rows["request_id"]) == {f"r{i}" for i in range(10)}
    assert "first served window: 10 requests" in ref.described
    compared = after(rows, ref)
    assert set(compared["request_id"]) == {f"r{i}" for i in range(10, 30)}  # never the reference's own rows


def test_the_first_window_closes_at_its_time_with_fewer_requests_and_is_filling_before():
    rows = served(5, 600.0)  # one request every 10 minutes: 6 fit in the first hour, 5 were served
    filling = first_served_window(rows, first_requests=100, first_hours=1.0, now=T0 + timedelta(minutes=45))
    assert not filling.complete and "filling until 100 requests" in filling.described
    closed = first_served_window(rows, first_requests=100, first_hours=0.5, now=T0 + timedelta(hours=2))
    assert closed.complete and closed.requests == 3  # 0, 10 and 20 minutes: within half an hour of the first


def test_no_traffic_yet_is_no_reference():
    ref = first_served_window(served(0, 1.0), 10, 1.0, T0)
    assert not ref.complete and ref.rows.empty and "no request served yet" in ref.described


def test_a_pinned_window_takes_the_requests_inside_it():
    rows = served(20, 60.0)
    ref = pinned_window(rows, T0 + timedelta(minutes=5), T0 + timedelta(minutes=10))
    assert ref.complete and ref.requests == 5 and set(ref.rows["request_id"]) == {f"r{i}" for i in range(5, 10)}
    assert set(after(rows, ref)["request_id"]) == {f"r{i}" for i in range(10, 20)}
