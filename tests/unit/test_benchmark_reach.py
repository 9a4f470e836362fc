"""The autoscaler benchmark's targets: dominance, the reach of a row, the distances to it, the extremes."""

from __future__ import annotations

import pytest

from benchmarks.autoscaler_ablation import ABLATIONS, ablated
from benchmarks.autoscaler_reach import reach
from benchmarks.autoscaler_targets import dominates, extremes, near_limit, row_checks, unreachable, vertical_check
from serving.autoscaler import policy


def run(bad, rs, requests=100_000):
    return {"bad": bad, "replica_seconds": rs, "requests": requests}


def test_a_baseline_dominates_only_when_no_worse_on_both_and_better_on_one():
    mine = run(100, 1_000.0)
    assert dominates(run(100, 999.0), mine) and dominates(run(99, 1_000.0), mine)
    assert not dominates(run(100, 1_000.0), mine)  # equal is not domination
    assert not dominates(run(50, 1_001.0), mine) and not dominates(run(101, 10.0), mine)


def test_a_baseline_at_the_floor_under_the_bound_is_out_of_reach_of_any_windowed_policy():
    r = {"floor_bad": 100, "bound_rs": 10_000.0}
    assert unreachable(run(100, 9_999.0), r)
    assert not unreachable(run(100, 10_000.0), r) and not unreachable(run(101, 5_000.0), r)
    best = run(100, 10_000.0)  # the best such a policy can do
    assert dominates(run(100, 9_999.0), best) and not dominates(run(101, 5_000.0), best)


def test_near_limit_measures_the_distance_to_the_floor_and_the_bound():
    r = {"floor_bad": 100, "bound_rs": 10_000.0}
    ok = near_limit(run(1_100, 20_000.0), r)
    assert ok["ok"] and ok["extra_bad_share"] == pytest.approx(0.01) and ok["rs_ratio"] == pytest.approx(2.0)
    assert not near_limit(run(1_101, 10_000.0), r)["ok"] and not near_limit(run(100, 20_001.0), r)["ok"]
    checks = row_checks(run(1_000, 15_000.0), {"hpa": run(900, 14_000.0), "kpa": run(100, 9_000.0)}, r)
    assert checks["dominated_by"] == ["hpa", "kpa"] and checks["out_of_reach"] == ["kpa"] and checks["ok"]


def test_vertical_check_wants_the_third_cycle_and_every_later_one_in_the_band():
    assert vertical_check([(30, 1.0), (60, 3.0), (90, 4.5), (120, 4.0)], 4.0)["ok"]
    assert not vertical_check([(30, 1.0), (60, 3.0), (90, 4.5), (120, 3.1)], 4.0)["ok"]
    assert not vertical_check([(30, 1.0), (60, 3.0)], 4.0)["ok"]


def test_extremes_rank_rows_by_the_advantage_over_the_nearest_baseline():
    rows = [
        {"name": n, "mine": run(bad, 1_000.0), "baselines": {"hpa": run(1_000, 1_000.0), "kpa": run(1_000, 900.0)}}
        for n, bad in (("a", 10), ("b", 2_000), ("c", 500), ("d", 5_000))
    ]
    wins, loses = extremes(rows, k=2)
    assert [r["name"] for r in wins] == ["a", "c"] and [r["name"] for r in loses] == ["d", "b"]


def test_an_ablation_patches_the_policy_for_its_run_only():
    before = policy.forecast
    with ablated("forecast"):
        assert policy.forecast is not before
    assert policy.forecast is before
    for rule in ABLATIONS:
        with ablated(rule):
            pass
    with pytest.raises(ValueError, match="unknown rule"), ablated("nope"):
        pass


def test_reach_of_a_spike_counts_the_floor_and_holds_replicas_for_the_window():
    r = reach("spike", "cpu", 0, True)
    assert r["floor_bad"] > 0
    # 300 req/s needs 4 cpu replicas (92 req/s each) and 3,000 req/s 33: the 180 s at the peak and the
    # 300 s window after it hold 33 for most of the 480 s counted
    assert 33 * 300 < r["bound_rs"] < 33 * 480


def test_the_models_targets_judge_the_start_floor_the_bound_and_the_best_baseline_on_steps():
    from benchmarks import autoscaler_targets as T

    def row(trace, mine, baselines, start_bad, rs_ratio, dominated=()):
        return {
            "trace": trace,
            "mine": mine,
            "baselines": baselines,
            "start_bad": start_bad,
            "rs_ratio": rs_ratio,
            "dominated_by": list(dominated),
            "extra_over_start": (mine["bad"] - start_bad) / mine["requests"],
        }

    run = lambda bad, rs: {"bad": bad, "replica_seconds": rs, "requests": 10_000}  # noqa: E731
    rows = [
        # a step: 40 over the start floor of 100 where HPA (the fewest bad) has 200 over it, at 1.05x its replica-s
        row("spike", run(140, 1050), {"hpa": run(300, 1000), "kpa": run(900, 500)}, 100, 1.2),
        # a burst: within the start floor + 1 %, but 60 over it against KPA's 100: more than half
        row("bursty", run(160, 900), {"hpa": run(400, 800), "kpa": run(200, 1000)}, 100, 2.6, dominated=("hpa",)),
        # no step: not judged beyond the anchors; 2 % over the start floor
        row("diurnal", run(300, 1000), {"hpa": run(100, 2000)}, 100, 1.4),
    ]
    m = T.model_targets(rows)
    assert (m["rows"], m["not_dominated"], m["within_start_floor"]) == (3, 2, 2)
    assert m["median_rs_ratio"] == 1.4 and m["median_ok"] and m["max_rs_ratio"] == 2.6 and not m["max_ok"]
    assert (m["stepped"], m["beyond_anchors"]) == (2, 1)
    check = T.beyond_anchors(rows[1]["mine"], rows[1]["baselines"], 100)
    assert check["best"] == "kpa" and not check["ok"] and "60 vs kpa's 100" in check["detail"]
