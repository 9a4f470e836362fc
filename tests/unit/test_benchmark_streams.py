"""The streams benchmark's arithmetic (benchmarks/streams.py): percentiles, the producer's pacing, drain rates from
stream ids, the consumer group's lag from XINFO GROUPS, a gauge from /metrics, the time back to the steady lag."""

from __future__ import annotations

import math

import pytest

from benchmarks.common import percentile
from benchmarks.streams_figures import drain_rate, due, gauge, group_lag, recovery_s
from serving.streams.broker import entry_ms


def test_percentile_is_the_nearest_rank():
    values = list(range(1, 101))  # 1..100, shuffled order must not matter
    assert percentile(reversed(values), 50) == 50
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([7, 3, 5], 50) == 5
    assert percentile([4], 99) == 4
    assert percentile([1, 2], 99) == 2  # never below the value that covers q % of them
    assert math.isnan(percentile([], 99))


def test_p99_of_a_thousand_latencies_is_the_tenth_largest():
    latencies = [10] * 990 + [50 + i for i in range(10)]  # the ten slowest: 50..59
    assert percentile(latencies, 99) == 10
    assert percentile([*latencies, 60], 99) == 50


def test_due_paces_a_fixed_rate_with_the_first_event_at_the_start():
    assert due(500, -0.1) == 0
    assert due(500, 0.0) == 1
    assert due(500, 0.001) == 1
    assert due(500, 0.002) == 2
    assert due(500, 1.0) == 501
    assert due(1000, 0.003) == 4  # 0.003 * 1000 is 2.9999... in floating point: still 3 intervals
    assert due(0.5, 3.9) == 2
    assert due(750.5, 30.0) == 22_516


def test_a_paced_loop_appends_the_difference_each_tick_and_never_falls_behind():
    sent, rate = 0, 333.0
    for tick in range(1, 2001):  # 10 s of 5 ms ticks
        n = due(rate, tick * 0.005) - sent
        assert n >= 0
        sent += n
    assert sent == due(rate, 10.0) == 3331


def test_entry_ms_reads_redis_timestamps_from_ids():
    assert entry_ms("1796334765187-0") == 1796334765187
    assert entry_ms(b"1796334765187-12") == 1796334765187


def test_drain_rate_counts_intervals_between_the_first_and_last_result():
    ids = [f"{1_000_000 + i}-0" for i in range(0, 2001, 2)]  # 1001 results over 2 s
    assert drain_rate(ids) == pytest.approx(500.0)
    assert drain_rate(reversed(ids)) == pytest.approx(500.0)
    assert drain_rate(["1000-0", "1000-1", "1000-2"]) == 0.0  # within one ms: no rate
    assert drain_rate(["1000-0"]) == 0.0
    assert drain_rate([]) == 0.0


def test_group_lag_is_unread_plus_pending_from_xinfo_groups():
    groups = [  # as redis-py returns XINFO GROUPS: str keys, bytes for the name and ids
        {"name": b"other", "consumers": 1, "pending": 9, "last-delivered-id": b"5-0", "entries-read": 3, "lag": 9},
        {
            "name": b"tollfree",
            "consumers": 1,
            "pending": 100,
            "last-delivered-id": b"7-0",
            "entries-read": 7,
            "lag": 42,
        },
    ]
    assert group_lag(groups, "tollfree") == 142
    assert group_lag(groups, "other") == 18
    assert group_lag(groups, "missing") is None
    assert group_lag([], "tollfree") is None
    unknown = [{"name": "tollfree", "pending": 3, "lag": None}]  # Redis cannot tell (entries deleted)
    assert group_lag(unknown, "tollfree") is None
    assert group_lag([{b"name": b"tollfree", b"pending": 0, b"lag": 0}], "tollfree") == 0


METRICS = """# HELP tollfree_replicas Ready replicas per served entity.
# TYPE tollfree_replicas gauge
tollfree_replicas{endpoint="fraud-stream",served_entity="fraud-champion"} 2.0
tollfree_replicas{endpoint="fraud-stream-2",served_entity="fraud-champion"} 7.0
tollfree_replicas_other{endpoint="fraud-stream",served_entity="x"} 5.0
tollfree_stream_events_total{endpoint="fraud-stream",stream="redis://127.0.0.1:1/tx",group="g",outcome="retry"} 156.0
tollfree_stream_events_total{endpoint="fraud-stream",stream="redis://127.0.0.1:1/tx",group="g",outcome="result"} 9.0
"""


def test_gauge_sums_one_endpoints_samples_of_one_family():
    assert gauge(METRICS, "tollfree_replicas", "fraud-stream") == 2.0
    assert gauge(METRICS, "tollfree_replicas", "fraud-stream-2") == 7.0
    assert gauge(METRICS, "tollfree_stream_events_total", "fraud-stream", 'outcome="retry"') == 156.0
    assert gauge(METRICS, "tollfree_stream_events_total", "fraud-stream") == 165.0
    assert gauge(METRICS, "tollfree_autoscaler_desired_replicas", "fraud-stream") is None


def test_recovery_is_the_first_sample_after_the_burst_at_or_below_the_steady_level():
    samples = [(9.0, 30), (10.5, 12_000), (11.5, None), (12.5, 4_000), (13.5, 25), (14.5, 10)]
    assert recovery_s(samples, since=10.0, level=30) == pytest.approx(3.5)
    assert recovery_s(samples, since=10.0, level=5) is None
    assert recovery_s(samples, since=14.5, level=30) is None  # only samples after the burst count
    # samples read while the burst was still being appended (the lag still at its level) do not count
    appending = [(9.0, 30), (10.2, 20), (11.5, 60_000), (30.0, 20)]
    assert recovery_s(appending, since=10.0, level=30) == pytest.approx(20.0)
