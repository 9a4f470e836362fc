"""The autoscaler benchmark's reach: which baselines no policy with tollfree's scale-down window can beat."""

from __future__ import annotations

from benchmarks.autoscaler import beats, out_of_reach, reach


def test_a_baseline_at_the_floor_cheaper_than_the_bound_over_0_7_is_out_of_reach():
    r = {"floor_bad": 100, "bound_rs": 10_000.0}
    at_floor = {"bad": 100, "replica_seconds": 14_000.0}     # beating it needs <= 9,800 at the floor
    assert out_of_reach(at_floor, r)
    assert not out_of_reach({"bad": 100, "replica_seconds": 15_000.0}, r)   # 10,500 >= the bound
    assert not out_of_reach({"bad": 101, "replica_seconds": 10_000.0}, r)   # fewer bad at its cost
    assert out_of_reach({"bad": 101, "replica_seconds": 9_999.0}, r)        # below the bound, too few to be 30 % cheaper


def test_what_is_out_of_reach_cannot_be_beaten_at_the_floor_and_the_bound():
    r = {"floor_bad": 100, "bound_rs": 10_000.0}
    best = {"bad": 100, "replica_seconds": 10_000.0}          # the best any such policy could do
    for b in ({"bad": 100, "replica_seconds": 14_000.0}, {"bad": 120, "replica_seconds": 9_000.0}):
        assert out_of_reach(b, r) and not beats(best, b)
    reachable = {"bad": 120, "replica_seconds": 12_000.0}
    assert not out_of_reach(reachable, r) and beats(best, reachable)


def test_reach_of_a_spike_counts_the_floor_and_holds_replicas_for_the_window():
    r = reach("spike", "cpu", 0, True)
    assert r["floor_bad"] > 0
    # 300 req/s needs 4 cpu replicas (92 req/s each) and 3,000 req/s 33: the 180 s at the peak and the
    # 300 s window after it hold 33 for most of the 480 s counted
    assert 33 * 300 < r["bound_rs"] < 33 * 480


def test_fixed_targets_names_the_nearest_run_and_whether_any_beats_every_baseline():
    from benchmarks.autoscaler import BASELINES, fixed_targets
    by = {("t", "p", b): {"bad": 100, "replica_seconds": 1_000.0} for b in BASELINES}
    by[("t", "p", "hpa")] = {"bad": 10, "replica_seconds": 2_000.0}      # cheap to beat on cost only
    runs = [
        {"trace": "t", "profile": "p", "target": 1.0, "shed_load": True, "bad": 50, "replica_seconds": 900.0},   # not vs hpa
        {"trace": "t", "profile": "p", "target": 2.0, "shed_load": False, "bad": 200, "replica_seconds": 500.0},  # loses all but
        {"trace": "t", "profile": "p", "target": 3.0, "shed_load": True, "bad": 10, "replica_seconds": 1_400.0},  # beats hpa only
    ]
    [row] = fixed_targets(runs, by)
    assert row["nearest"]["target"] == 1.0 and row["nearest"]["lost"] == ["hpa"] and not row["any_beats_all"]
    runs.append({"trace": "t", "profile": "p", "target": 4.0, "shed_load": True, "bad": 10, "replica_seconds": 950.0})
    [row] = fixed_targets(runs, by)
    assert row["any_beats_all"] and row["nearest"]["target"] == 4.0
