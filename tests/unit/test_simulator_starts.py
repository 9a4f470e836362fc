"""The simulator's replica starts: cold, a live-like warm pool refilled one standby at a time, unlimited."""

from __future__ import annotations

import math

import pytest

from simulator.profiles import ModelProfile
from simulator.starts import Starts

PROFILE = ModelProfile(
    name="p",
    service_ms=10.0,
    service_sigma=0.0,
    parallelism=1,
    slo_ms=100.0,
    user_target=1.0,
    model_load_s=10.0,
    cold_start_s=8.0,
    warm_start_s=0.5,
)


def test_without_standbys_every_replica_starts_cold():
    starts = Starts(PROFILE, 0)
    assert starts.ready_times(5.0, 2) == [23.0, 23.0]
    assert (starts.warm_starts, starts.cold_starts) == (0, 2)


def test_one_standby_serves_one_start_and_is_refilled_after_the_replica_it_became_is_ready():
    starts = Starts(PROFILE, 1)
    # a scale-up of three: one warm (0.5 + 10 s), two cold (8 + 10 s)
    assert starts.ready_times(0.0, 3) == [10.5, 18.0, 18.0]
    # the refill starts when the warm replica is ready (10.5 s) and takes a cold start (8 s): idle at 18.5
    assert starts.ready_times(18.0, 1) == [36.0]
    assert starts.ready_times(18.5, 1) == [29.0]
    assert (starts.warm_starts, starts.cold_starts) == (2, 3)


def test_refills_run_one_at_a_time():
    starts = Starts(PROFILE, 2)
    assert starts.ready_times(0.0, 2) == [10.5, 10.5]
    # two holes, both asked for at 10.5 s: the second refill starts when the first ends
    assert starts.ready_times(18.5, 2) == [29.0, 36.5]  # one standby back at 18.5, the other at 26.5
    assert starts.ready_times(26.5, 1) == [37.0]


def test_an_unlimited_pool_always_has_a_standby():
    starts = Starts(PROFILE, math.inf)
    assert starts.ready_times(0.0, 50) == [10.5] * 50
    assert starts.ready_times(1.0, 50) == [11.5] * 50


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_a_pool_size_that_is_not_a_whole_number_is_refused(bad):
    with pytest.raises(ValueError, match="warm_pool"):
        Starts(PROFILE, bad)


def test_the_simulator_cli_refuses_a_negative_warm_pool(capsys):
    from simulator.__main__ import main

    assert main(["--trace", "spike", "--warm-pool", "-1"]) == 2
    assert "--warm-pool" in capsys.readouterr().err


def test_the_benchmark_refuses_a_warm_pool_that_is_not_a_whole_number_and_an_unknown_rule():
    from benchmarks.autoscaler import parse

    for argv in (["--warm-pool", "1.5"], ["--warm-pool", "-1"], ["--ablate", "nope"]):
        with pytest.raises(SystemExit):
            parse(argv)


def test_the_lead_time_a_sample_carries_is_warm_while_a_standby_is_idle_else_cold():
    starts = Starts(PROFILE, 1)
    assert starts.ready_in(0.0) == 10.5  # the standby: 0.5 s + the 10 s load
    starts.ready_times(0.0, 1)
    assert starts.ready_in(1.0) == 18.0  # taken: a cold start (8 s + the load)
    assert starts.ready_in(18.5) == 10.5  # refilled once the replica it became was ready, 8 s later
    assert Starts(PROFILE, 0).ready_in(0.0) == 18.0
