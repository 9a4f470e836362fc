"""The chaos soak's pure parts: the fault plan a seed draws, the stream's lost and doubled counts, and the figures
(failures, fault windows, the verdict) from a run's outcomes. The soak itself runs the stack for minutes: it is a
benchmark (``make soak CHAOS=1``), not a test."""

from __future__ import annotations

import collections
import itertools

import pytest

from benchmarks.chaos_faults import GAP_S, LEAD_S, TAIL_S, Fault, plan
from benchmarks.chaos_report import NOT_SENT, WINDOW_AFTER_S, failure_spans, figures, render
from benchmarks.chaos_stream import StreamFigures, count
from benchmarks.chaos_watch import QueueSample, read_queue
from benchmarks.load import LoadResult, Outcome

OFFERED = {
    "minutes": 1,
    "seed": 0,
    "gateways": 2,
    "replicas": 2,
    "rows": 20,
    "capacity_rps": 100.0,
    "load": 0.5,
    "rate_rps": 50.0,
    "stream_rate": 20.0,
}
CLEAN = StreamFigures(10, 10, 0, 0, 0, 0, 1.0)


@pytest.mark.parametrize("minutes", [1, 2, 10, 30])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_plan_has_one_postgresql_restart_and_its_faults_apart_inside_the_run(minutes: int, seed: int) -> None:
    faults = plan(seed, minutes * 60)
    kinds = [f.kind for f in faults]
    assert kinds.count("postgres") == 1
    if len(faults) >= 3:
        assert {"replica", "gateway"} <= set(kinds)
    times = [f.at_s for f in faults]
    assert times == sorted(times) and times[0] >= LEAD_S and times[-1] <= minutes * 60 - TAIL_S + 0.1
    assert all(b - a >= GAP_S - 0.1 for a, b in itertools.pairwise(times))
    assert plan(seed, minutes * 60) == faults


def test_a_ten_minute_plan_spreads_a_dozen_faults_and_a_run_too_short_is_refused() -> None:
    assert 10 <= len(plan(0, 600)) <= 16
    assert plan(0, 600) != plan(1, 600)
    with pytest.raises(ValueError, match="no room for a fault"):
        plan(0, LEAD_S + TAIL_S - 1)


def test_lost_is_never_scored_and_doubled_is_more_than_one_output() -> None:
    results = collections.Counter({"1-0": 1, "2-0": 2, "4-0": 1, "9-0": 1})  # 9-0: not produced by this run
    dead = collections.Counter({"3-0": 1, "4-0": 1})
    figures_ = count(["1-0", "2-0", "3-0", "4-0", "5-0"], results, dead, append_errors=0, drained_s=2.0)
    assert (figures_.produced, figures_.scored, figures_.dead_letters) == (5, 3, 2)
    assert figures_.lost == 2  # 3-0 went to the dead letters only, 5-0 nowhere
    assert figures_.doubled == 2  # 2-0 scored twice, 4-0 scored and dead-lettered


def _outcome(started: float, status: int | None, latency_s: float = 0.01) -> Outcome:
    return Outcome("r", started, latency_s, status, error=None if status else "timeout")


def test_failures_are_counted_by_status_and_attributed_to_the_fault_window_they_fall_in() -> None:
    began = 1000.0
    outcomes = [_outcome(began + t, 200) for t in range(60)]
    outcomes += [_outcome(began + 21.0, 503), _outcome(began + 22.0, None), _outcome(began + 50.0, 200, 2.0)]
    load = LoadResult(outcomes, 60.0, skipped=3)
    kill = Fault("gateway", 20.0, 20.5, 25.0, "gateway-1")
    report = figures(load, began, [kill], CLEAN, OFFERED)
    assert report["failures_by_status"] == {"503": 1, "error:timeout": 1, NOT_SENT: 3}
    assert report["failures"] == 5 and not report["passed"]
    window = report["faults"][0]
    assert window["failures"] == {"503": 1, "error:timeout": 1}
    inside = [o for o in outcomes if 20.5 <= o.started - began <= 25.0 + WINDOW_AFTER_S]
    assert window["requests"] == report["requests_during_faults"] == len(inside)
    assert report["p99_during_faults_ms"] == 10.0 and report["max_ms"] == 2000.0  # the slow one came later
    # not-sent ones have no time; no queue read in this run
    assert report["failure_spans"] == [{"first_s": 21.0, "last_s": 22.0, "count": 2, "queues": {}}]
    assert "FAIL" in render(report) and "gateway-1" in render(report) and "21.0-22.0 s: 2" in render(report)


def test_each_span_of_failures_shows_each_gateways_lowest_queue_limit_and_deepest_queue_around_it() -> None:
    began = 1000.0
    load = LoadResult([_outcome(began + 30.0, 429), _outcome(began + 31.0, 429)], 60.0)
    queues = [
        QueueSample(28.5, 8081, 40.0, 0.0),  # before the span's second of margin: not read
        QueueSample(29.5, 8081, 12.0, 12.0),
        QueueSample(30.5, 8082, 10000.0, 3.0),
        QueueSample(31.5, 8081, 38.0, 2.0),
        QueueSample(32.5, 8081, 1.0, 0.0),  # after it
    ]
    (span,) = figures(load, began, [], CLEAN, OFFERED, queues)["failure_spans"]
    assert span["queues"] == {
        "8081": {"min_limit": 12.0, "max_depth": 12.0},
        "8082": {"min_limit": 10000.0, "max_depth": 3.0},
    }
    assert "gateway :8081 limit 12, depth 12; gateway :8082 limit 10000, depth 3" in render(
        figures(load, began, [], CLEAN, OFFERED, queues)
    )


def test_the_queue_of_an_endpoint_is_read_from_a_metrics_page_summed_over_its_entities() -> None:
    page = """# TYPE tollfree_queue_limit gauge
tollfree_queue_limit{endpoint="chaos",served_entity="a"} 30.0
tollfree_queue_limit{endpoint="chaos",served_entity="b"} 8.0
tollfree_queue_limit{endpoint="other",served_entity="a"} 5.0
# TYPE tollfree_queue_depth gauge
tollfree_queue_depth{endpoint="chaos",served_entity="a"} 2.0
"""
    assert read_queue(page, "chaos") == {"limit": 38.0, "depth": 2.0}
    assert read_queue(page, "missing") == {}


def test_failures_further_apart_than_the_gap_are_spans_of_their_own() -> None:
    began = 50.0
    outcomes = [_outcome(began + t, 429) for t in (10.0, 12.0, 16.9, 30.0)] + [_outcome(began + 11.0, 200)]
    assert failure_spans(outcomes, began) == [
        {"first_s": 10.0, "last_s": 16.9, "count": 3},
        {"first_s": 30.0, "last_s": 30.0, "count": 1},
    ]


def test_a_run_passes_only_with_no_failure_nothing_lost_or_doubled_and_every_fault_done() -> None:
    load = LoadResult([_outcome(1000.0 + t, 200) for t in range(60)], 60.0)
    done = Fault("replica", 20.0, 20.0, 20.1, "replica pid 1")
    assert figures(load, 1000.0, [done], CLEAN, OFFERED)["passed"]
    assert "PASS" in render(figures(load, 1000.0, [done], CLEAN, OFFERED))
    undone = Fault("replica", 20.0, 20.0, 20.1, "replica", error="RuntimeError: no replica listed")
    assert not figures(load, 1000.0, [undone], CLEAN, OFFERED)["passed"]
    doubled = StreamFigures(10, 10, 0, 0, 1, 0, 1.0)
    assert not figures(load, 1000.0, [done], doubled, OFFERED)["passed"]


def test_the_header_names_a_fixed_rate_or_the_share_of_the_capacity_measured() -> None:
    load = LoadResult([_outcome(1000.0 + t, 200) for t in range(60)], 60.0)
    done = Fault("replica", 20.0, 20.0, 20.1, "replica pid 1")
    share = render(figures(load, 1000.0, [done], CLEAN, OFFERED)).splitlines()[0]
    fixed = render(figures(load, 1000.0, [done], CLEAN, {**OFFERED, "load": None})).splitlines()[0]
    assert "(50% of " in share and "(fixed; " in fixed


def test_a_rate_or_load_not_above_zero_is_refused_before_anything_starts(capsys) -> None:
    import pytest

    from benchmarks.chaos import main

    for bad in (["--rate", "0"], ["--load", "-1"]):
        with pytest.raises(SystemExit) as exited:
            main(["--minutes", "10", *bad])
        assert exited.value.code == 2
        assert "--rate and --load must be above 0" in capsys.readouterr().err
