"""The autoscaler benchmark's targets: dominance, the reach of a row, the distances to it, the extremes."""

from __future__ import annotations

import pytest

from benchmarks.autoscaler import reach
from benchmarks.autoscaler_ablation import ABLATIONS, ablated
from benchmarks.autoscaler_targets import dominates, extremes, near_limit, row_checks, unreachable, vertical_check
from serving.autoscaler import policy


def run(bad, rs, requests=100_000):
    return {"bad": bad, "replica_seconds": rs, "requests": requests}


def test_a_baseline_dominates_only_when_no_worse_on_both_and_better_on_one():
    mine = run(100, 1_000.0)
    assert dominates(run(100, 999.0), mine) and dominates(run(99, 1_000.0), mine)
    assert not dominates(run(100, 1_000.0), mine)            # equal is not domination
    assert not dominates(run(50, 1_001.0), mine) and not dominates(run(101, 10.0), mine)


def test_a_baseline_at_the_floor_under_the_bound_is_out_of_reach_of_any_windowed_policy():
    r = {"floor_bad": 100, "bound_rs": 10_000.0}
    assert unreachable(run(100, 9_999.0), r)
    assert not unreachable(run(100, 10_000.0), r) and not unreachable(run(101, 5_000.0), r)
    best = run(100, 10_000.0)                                 # the best such a policy can do
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
    rows = [{"name": n, "mine": run(bad, 1_000.0), "baselines": {"hpa": run(1_000, 1_000.0), "kpa": run(1_000, 900.0)}}
            for n, bad in (("a", 10), ("b", 2_000), ("c", 500), ("d", 5_000))]
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
    with pytest.raises(ValueError, match="unknown rule"):
        with ablated("nope"):
            pass


def test_reach_of_a_spike_counts_the_floor_and_holds_replicas_for_the_window():
    r = reach("spike", "cpu", 0, True)
    assert r["floor_bad"] > 0
    # 300 req/s needs 4 cpu replicas (92 req/s each) and 3,000 req/s 33: the 180 s at the peak and the
    # 300 s window after it hold 33 for most of the 480 s counted
    assert 33 * 300 < r["bound_rs"] < 33 * 480
