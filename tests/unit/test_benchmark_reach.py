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
