"""The policy is stepped by passing ``now``: no clock, no sleeps."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import EntityScaler
from serving.autoscaler.policy import Decision, PolicyState, decide
from serving.autoscaler.signals import Sample, SampleHistory

SERVICE_S = 0.1


def sample(
    t: float,
    in_flight: float,
    ready: int,
    *,
    queued: float = 0.0,
    p99: float | None = 50.0,
    util: float | None = None,
    rate: float | None = None,
) -> Sample:
    """A steady second: ``rate`` arrivals (default: in-flight / service time), as many completions."""
    busy = in_flight - queued
    rate = busy / SERVICE_S if rate is None else rate
    return Sample(
        t=t,
        in_flight=in_flight,
        ready_replicas=ready,
        replicas=ready,
        queue_depth=queued,
        requests=int(rate),
        completed=int(busy / SERVICE_S),
        latency_p50_ms=p99,
        latency_p99_ms=p99,
        utilisation=util,
    )


def run(scaler: EntityScaler, start: int, end: int, load, ready=None, **kw):
    """Feed one sample a second from ``start`` to ``end`` (exclusive) and decide each second."""
    decisions = []
    for t in range(start, end):
        r = scaler.state.replicas if ready is None else ready
        scaler.observe(sample(float(t), load(t) if callable(load) else load, max(r, 0), **kw))
        decisions.append(scaler.decide(float(t)))
    return decisions


def horizontal_only(**kw) -> ScalingConfig:
    return ScalingConfig(vertical=False, initial_target=10.0, **kw)


def test_desired_is_ceil_of_concurrency_over_target_at_the_5s_boundary():
    scaler = EntityScaler(horizontal_only(), replicas=1)
    decisions = run(scaler, 1, 5, 10.0)
    assert all(not d.horizontal for d in decisions)  # nothing before the first 5 s
    d = run(scaler, 5, 12, 95.0)[-1]
    assert scaler.state.replicas == math.ceil(95 / 10) == d.replicas


def test_within_the_tolerance_band_nothing_changes():
    scaler = EntityScaler(horizontal_only(), replicas=10)
    run(scaler, 1, 400, 95.0)  # 5 % under 10 x 10: kept
    assert scaler.state.replicas == 10
    run(scaler, 400, 710, 85.0)  # 15 % under, for longer than the window: out of the band
    assert scaler.state.replicas == 9
    run(scaler, 710, 720, 95.0)  # over capacity: no band on the way up
    assert scaler.state.replicas == 10


def test_replicas_leave_only_after_the_scale_down_window():
    scaler = EntityScaler(horizontal_only(), replicas=1)
    run(scaler, 1, 60, 200.0)
    assert scaler.state.replicas == 20
    run(scaler, 60, 355, 20.0)  # the last high sample was at t=59
    assert scaler.state.replicas == 20
    run(scaler, 355, 366, 20.0)
    assert scaler.state.replicas == 2


def test_a_burst_s_backlog_draining_buys_nothing_and_a_standing_queue_buys_what_serves_it_in_time():
    # 2 replicas, 40 requests/s of 0.1 s = 4 in service; a burst leaves 400 queued that drain over the next seconds
    scaler = EntityScaler(horizontal_only(), replicas=2)
    run(scaler, 1, 11, 4.0, rate=40.0)
    for t, queued in zip(range(11, 16), (400.0, 300.0, 200.0, 100.0, 0.0)):
        scaler.observe(sample(float(t), 4.0 + queued, 2, queued=queued, rate=40.0))
        scaler.decide(float(t))
    assert scaler.state.replicas <= 2  # the load is what arrivals need (40/s x 0.1 s = 4), not the queue a burst left
    # a closed loop of 44 clients: 40 wait through every second, 4 in service. FIFO, the last waits 40 x 0.1 s / n:
    # within 80 % of the 500 ms SLO takes 40 x 0.1 / 0.4 = 10 in service, one replica of target 10
    closed = EntityScaler(horizontal_only(), replicas=1)
    decisions = run(closed, 1, 12, 44.0, queued=40.0, rate=40.0)
    assert closed.state.replicas == 1 and decisions[-1].inputs.get("standing_queue", 10.0) == pytest.approx(10.0)
    crowded = EntityScaler(horizontal_only(), replicas=1)  # 200 waiting: 50 in service, 5 replicas
    run(crowded, 1, 12, 204.0, queued=200.0, rate=40.0)
    assert crowded.state.replicas == 5


def test_a_step_is_decided_within_a_second_and_sized_for_the_new_rate_not_projected():
    scaler = EntityScaler(horizontal_only(), replicas=2)
    run(scaler, 1, 12, 15.0)
    assert scaler.state.replicas == 2
    d = run(scaler, 12, 13, 150.0)[-1]  # t=12 is not a 5-s boundary
    assert d.horizontal and d.replicas == 15
    assert d.inputs["forecast"] == pytest.approx(150.0)  # one rise: the trend of pairwise slopes is flat
    d = run(scaler, 13, 14, 150.0)[-1]
    assert not d.horizontal and scaler.state.replicas == 15


def lead(samples_load, lead_s: float):
    """``run``'s samples with ``ready_in_s`` set: what the backend says a replica asked for now needs."""

    def feed(scaler: EntityScaler, start: int, end: int) -> list[Decision]:
        out = []
        for t in range(start, end):
            s = sample(float(t), samples_load(t), scaler.state.replicas)
            scaler.observe(replace(s, ready_in_s=lead_s))
            out.append(scaler.decide(float(t)))
        return out

    return feed


def test_a_ramp_is_sized_for_the_load_a_new_replica_will_meet_after_its_start():
    # 15 in flight until t=10, then +10 a second; a replica asked for now is ready 4 s later
    ramp = lambda t: 15.0 if t <= 10 else 15.0 + 10.0 * (t - 10)  # noqa: E731
    scaler = EntityScaler(horizontal_only(max_replicas=50), replicas=2)
    lead(ramp, 4.0)(scaler, 1, 11)
    d = lead(ramp, 4.0)(scaler, 11, 15)[-1]  # t=14: 55 in flight, rising 10 a second for 4 s
    assert d.inputs["forecast"] == pytest.approx(55.0 + 10.0 * 4.0)
    assert d.replicas == math.ceil(95.0 / 10)
    without = EntityScaler(horizontal_only(max_replicas=50), replicas=2)  # a backend that cannot say: no lead
    lead(ramp, 0.0)(without, 1, 15)
    assert without.state.replicas == math.ceil(55.0 / 10)


def test_scale_to_zero_after_the_idle_window_and_back_on_the_first_request():
    config = horizontal_only(min_replicas=0, scale_to_zero=True, idle_window_s=60.0)
    scaler = EntityScaler(config, replicas=1)
    run(scaler, 1, 10, 5.0)
    run(scaler, 10, 200, 0.0, p99=None)
    assert scaler.state.replicas == 1  # the 300 s down window still holds the load seen at t<10
    run(scaler, 200, 320, 0.0, p99=None)
    assert scaler.state.replicas == 0
    scaler.observe(Sample(t=320.0, in_flight=3.0, ready_replicas=0, queue_depth=3.0, requests=3))
    d = scaler.decide(320.0)  # not a 5-s boundary: activation is immediate
    assert d.horizontal and d.replicas >= 1


def test_the_last_replica_leaves_only_after_the_idle_window_even_when_the_scale_down_window_is_shorter():
    config = horizontal_only(min_replicas=0, scale_to_zero=True, idle_window_s=120.0, scale_down_window_s=20.0)
    scaler = EntityScaler(config, replicas=1)
    run(scaler, 1, 10, 5.0)
    run(scaler, 10, 125, 0.0, p99=None)
    assert scaler.state.replicas == 1  # the 20-s window emptied at t ~ 30; the idle window is 120 s
    run(scaler, 125, 140, 0.0, p99=None)
    assert scaler.state.replicas == 0


def test_the_provisioned_minimum_holds_without_load():
    scaler = EntityScaler(horizontal_only(min_replicas=1, provisioned_concurrency=35), replicas=1)
    run(scaler, 1, 400, 0.0, p99=None)
    assert scaler.state.replicas == 4  # ceil(35 / 10)
    assert scaler.floor == 4


def test_vertical_raises_the_target_towards_the_utilisation_aim_in_capped_steps():
    config = ScalingConfig(initial_target=4.0, max_step_up=4.0, target_utilisation=0.8, latency_slo_ms=500)
    scaler = EntityScaler(config, replicas=10)
    # each replica could hold 100 at 100 % busy; the load stops growing at 40 a replica (40 % busy)
    targets = []
    for cycle in range(5):
        t0 = 2 + 30 * cycle if cycle else 1  # a vertical cycle ends at t = 31, 61, ...
        target = scaler.state.target
        run(
            scaler,
            t0,
            32 + 30 * cycle,
            lambda t, target=target: 10 * min(target, 40.0),
            ready=10,
            util=min(target, 40.0) / 100,
        )
        targets.append(scaler.state.target)
    assert targets[0] == pytest.approx(16.0)  # capped at 4x
    assert targets[1] == pytest.approx(64.0)
    # then the aim in flight: 100 slots at 1 - 1/sqrt(100) busy (p99 far inside the SLO, nothing queued)
    assert targets[2] == pytest.approx(100 * (1 - 1 / math.sqrt(100)))
    assert targets[3] == targets[4] == targets[2]  # steady


def test_latency_slack_lets_a_wide_replica_run_fuller_but_never_past_its_capacity():
    # 256 slots a replica, p99 at 6 s against an 8 s goal (10 s SLO), nothing queued: the aim rises
    # from 80 % busy to 1 - 1/sqrt(256) (one standard deviation of a replica's in-flight count spare)
    config = ScalingConfig(initial_target=200.0, latency_slo_ms=10_000)
    scaler = EntityScaler(config, replicas=10)
    run(scaler, 1, 32, 10 * 200.0, ready=10, util=200 / 256, p99=6000.0)
    assert scaler.state.target == pytest.approx(256 * (1 - 1 / 16))
    # p99 even further inside the goal: the aim stays at that bound, short of the 256 slots measured
    scaler = EntityScaler(config, replicas=10)
    run(scaler, 1, 32, 10 * 200.0, ready=10, util=200 / 256, p99=600.0)
    assert scaler.state.target == pytest.approx(256 * (1 - 1 / 16))


def test_no_latency_slack_while_requests_queue_or_for_a_narrow_replica():
    config = ScalingConfig(initial_target=200.0, latency_slo_ms=10_000)
    scaler = EntityScaler(config, replicas=10)
    # 20 % of the in-flight requests wait: contention, the plain 80 % aim (of the 256 slots measured)
    run(scaler, 1, 32, 10 * 250.0, ready=10, queued=10 * 50.0, util=200 / 256, p99=6000.0)
    assert scaler.state.target == pytest.approx(200.0)  # 0.8 x 256 = 204.8: within MIN_CHANGE, held
    # 4 slots a replica: 1 - 1/sqrt(4) = 50 % is below the plain aim, which stays (80 % of 4 = 3.2)
    config = ScalingConfig(initial_target=2.0, latency_slo_ms=200)
    scaler = EntityScaler(config, replicas=10)
    run(scaler, 1, 32, 10 * 2.0, ready=10, util=2.0 / 4, p99=50.0)
    assert scaler.state.target == pytest.approx(3.2)


def test_vertical_decreases_fast_under_latency_stress_and_holds_when_between_marks():
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100, max_step_down=0.5)
    scaler = EntityScaler(config, replicas=5)
    run(scaler, 1, 32, 200.0, ready=5, p99=400.0, util=1.0)  # 4x the SLO, fully busy
    assert scaler.state.target == 20.0  # at most halved in one cycle
    assert scaler.state.ceiling == 40.0
    run(scaler, 32, 62, 100.0, ready=5, p99=80.0, util=0.75)  # 0.8 SLO: between the marks
    assert scaler.state.target == 20.0


def test_latency_from_a_slow_model_without_contention_does_not_lower_the_target():
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100)
    scaler = EntityScaler(config, replicas=5)
    run(scaler, 1, 32, 100.0, ready=5, p99=300.0, util=0.5)  # slow, but half idle and no queue
    # 20 in flight a replica at 50 % busy: 40 slots, so the utilisation aim is 0.8 x 40 = 32; the p99
    # over the SLO is the model's own and cuts nothing (halved, or 40 x 80 / 300, would be far lower)
    assert scaler.state.target == pytest.approx(32.0)


def test_decide_is_pure():
    config = ScalingConfig()
    history = SampleHistory(keep_s=400)
    for t in range(1, 40):
        history.add(sample(float(t), 30.0, 2, util=0.5))
    signals = history.snapshot()
    state = PolicyState.initial(config, replicas=2)
    a = decide(config, signals, state, 39.0)
    b = decide(config, signals, state, 39.0)
    assert a == b


def test_history_keeps_its_horizon_and_a_snapshot_reads_a_window():
    history = SampleHistory(keep_s=10)
    for t, v in [(1, 5.0), (2, 9.0), (3, 1.0), (20, 2.0)]:
        history.add(Sample(t=float(t), in_flight=v, ready_replicas=1))
    assert len(history) == 1  # older than 10 s dropped
    h = SampleHistory(keep_s=100)
    for t, v in [(1, 5.0), (2, 9.0), (3, 1.0)]:
        h.add(Sample(t=float(t), in_flight=v, ready_replicas=1))
    s = h.snapshot()
    assert [x.in_flight for x in s.since(3.0 - 2.0)] == [9.0, 1.0]
    assert s.since(10.0) == () and s.last.in_flight == 1.0


def test_replicas_held_by_the_scale_down_window_do_not_raise_the_target():
    # 10 replicas held after the load fell to 8 in flight (3 replicas' worth at target 3.2): the low
    # in-flight count a replica is the hold, not headroom; the target stays at the plain aim or below
    config = ScalingConfig(initial_target=3.2, latency_slo_ms=500)
    scaler = EntityScaler(config, replicas=10)
    scaler.state = replace(scaler.state, last_horizontal=1e9)  # the horizontal holds (not due)
    run(scaler, 1, 32, 8.0, ready=10, util=0.8 / 4)
    assert scaler.state.replicas == 10
    assert scaler.state.target <= 0.8 * 4 + 1e-9


def test_near_saturation_the_stress_cut_follows_queueing_not_proportion():
    # 75 % busy, p99 150 ms against a goal of 80 ms (SLO 100): latency in proportion to the load would
    # cut the target to 40 x 80/150 = 21.3; waiting that grows as 1/(1-u) puts p99 at the goal at
    # u = 1 - 0.25 x 150/80 = 53 %, so the target falls by 0.53/0.75 only
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100, max_step_down=0.5)
    scaler = EntityScaler(config, replicas=5)
    run(scaler, 1, 32, 200.0, ready=5, queued=20.0, p99=150.0, util=0.75)
    u_goal = 1 - 0.25 * 150 / 80
    assert scaler.state.target == pytest.approx(40.0 * u_goal / 0.75)
    assert scaler.state.ceiling == 40.0
    # far from saturation the proportional cut is the bound: 30 % busy, the same latency excess
    scaler = EntityScaler(config, replicas=5)
    run(scaler, 1, 32, 200.0, ready=5, queued=50.0, p99=150.0, util=0.3)
    assert scaler.state.target == pytest.approx(40.0 * 80 / 150)


def test_a_stress_cut_smaller_than_min_change_is_not_made():
    # 95 % busy, p99 92 ms (over the 90 % mark, 15 % over the 80 ms goal): queueing asks for a 1 %
    # lower target, under MIN_CHANGE: the target holds (the ceiling marks it), not the old forced -10 %
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100)
    scaler = EntityScaler(config, replicas=5)
    run(scaler, 1, 32, 200.0, ready=5, queued=20.0, p99=92.0, util=0.95)
    assert scaler.state.latency_stressed
    assert scaler.state.target == 40.0
    assert scaler.state.ceiling == 40.0
    # still stressed (above the 70 % low mark) with p99 under the goal: held, not lowered again
    run(scaler, 32, 62, 200.0, ready=5, queued=20.0, p99=75.0, util=0.9)
    assert scaler.state.latency_stressed
    assert scaler.state.target == 40.0


def test_seconds_while_replicas_start_do_not_make_stress_but_do_not_count_as_calm():
    # 10 of 30 s with replicas starting (p99 300 ms, SLO 100), 20 s with all of them ready (p99 60 ms):
    # stress is judged on the 20 settled seconds (none), calm on all 30 (p99 140: not calm), so the
    # target neither falls nor rises
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100)

    def cycle(settled_p99: float) -> Decision:
        scaler = EntityScaler(config, replicas=10)
        scaler.state = replace(scaler.state, last_horizontal=1e9)  # the horizontal holds (not due)
        for t in range(1, 32):
            starting = t <= 11
            scaler.observe(
                Sample(
                    t=float(t),
                    in_flight=400.0,
                    ready_replicas=5 if starting else 10,
                    replicas=10,
                    queue_depth=100.0,
                    requests=2000,
                    completed=2000,
                    latency_p99_ms=300.0 if starting else settled_p99,
                    utilisation=0.5,
                )
            )
            d = scaler.decide(float(t))
        assert d.vertical
        return d

    d = cycle(60.0)
    assert d.inputs["p99_settled_ms"] == pytest.approx(60.0)
    assert d.inputs["p99_ms"] == pytest.approx((10 * 300 + 20 * 60) / 30)
    assert not d.inputs["latency_stressed"] and d.inputs["vertical"] == "hold: between marks"
    assert d.target_concurrency == 40.0
    # the settled seconds themselves over the goal: the target is cut, by what they show
    d = cycle(160.0)
    assert d.inputs["latency_stressed"] and d.target_concurrency < 40.0 * 0.9


def test_a_long_scale_up_still_lets_latency_lower_the_target():
    # every second of the cycle with replicas starting: too few settled seconds to judge on, so all of
    # them count (a target too high for the load stays visible during a long scale-up)
    config = ScalingConfig(initial_target=40.0, latency_slo_ms=100, max_step_down=0.5)
    scaler = EntityScaler(config, replicas=10)
    scaler.state = replace(scaler.state, last_horizontal=1e9)
    for t in range(1, 32):
        scaler.observe(
            Sample(
                t=float(t),
                in_flight=400.0,
                ready_replicas=5,
                replicas=10,
                queue_depth=200.0,
                requests=2000,
                completed=2000,
                latency_p99_ms=400.0,
                utilisation=1.0,
            )
        )
        scaler.decide(float(t))
    assert scaler.state.target == 20.0


def test_a_stream_backlog_adds_the_replicas_that_serve_its_arrivals_within_max_lag_s():
    """2 replicas serve 100 events/s of 0.2 s (20 in flight, target 10 each); 600 events wait and must drain within
    10 s, 60 a second more: (100 + 60) x 0.2 = 32 in flight, 4 replicas."""
    config = horizontal_only(max_replicas=8)
    scaler = EntityScaler(config, replicas=2)
    history = []
    for t in range(1, 11):
        backlog = 60.0 if t >= 6 else 0.0
        s = Sample(
            t=float(t),
            in_flight=20.0,
            ready_replicas=2,
            replicas=2,
            requests=100,
            completed=100,
            stream_backlog_per_s=backlog,
        )
        scaler.observe(s)
        history.append(scaler.decide(float(t)))
    assert scaler.state.replicas == 4
    assert any(d.inputs.get("stream_backlog") == pytest.approx(12.0) for d in history)


def test_a_stream_backlog_holds_its_replicas_when_the_load_alone_would_scale_down():
    """4 replicas at 30 in flight (0.9 x 40 would let one go); the backlog's 100 events/s of 0.1 s keep all 4."""
    config = horizontal_only(max_replicas=8, scale_down_window_s=20.0)
    scaler = EntityScaler(config, replicas=4)
    for t in range(1, 31):
        scaler.observe(
            Sample(
                t=float(t),
                in_flight=30.0,
                ready_replicas=4,
                replicas=4,
                requests=300,
                completed=300,
                stream_backlog_per_s=100.0,
            )
        )
        scaler.decide(float(t))
    assert scaler.state.replicas == 4
    alone = EntityScaler(config, replicas=4)
    for t in range(1, 31):
        alone.observe(Sample(t=float(t), in_flight=30.0, ready_replicas=4, replicas=4, requests=300, completed=300))
        alone.decide(float(t))
    assert alone.state.replicas == 3


def test_no_stream_backlog_or_no_throughput_measured_adds_nothing():
    config = horizontal_only(max_replicas=8)
    for backlog, completed in ((0.0, 100), (500.0, 0)):
        scaler = EntityScaler(config, replicas=2)
        for t in range(1, 11):
            scaler.observe(
                Sample(
                    t=float(t),
                    in_flight=20.0,
                    ready_replicas=2,
                    replicas=2,
                    requests=completed,
                    completed=completed,
                    stream_backlog_per_s=backlog,
                )
            )
            scaler.decide(float(t))
        assert scaler.state.replicas == 2, (backlog, completed)


def _on_machine(cores: int, busy: float | None):
    """``run``'s load with every sample on a machine of ``cores`` cores, ``busy`` of them busy."""

    def feed(scaler: EntityScaler, start: int, end: int, load: float) -> list[Decision]:
        decisions = []
        for t in range(start, end):
            s = sample(float(t), load, scaler.state.replicas)
            scaler.observe(replace(s, cores=cores, cores_busy=busy))
            decisions.append(scaler.decide(float(t)))
        return decisions

    return feed


def test_replicas_on_one_machine_do_not_grow_past_its_cores_while_they_are_busy():
    scaler = EntityScaler(horizontal_only(), replicas=1)
    last = _on_machine(2, 0.97)(scaler, 1, 12, 40.0)[-1]  # the load asks for 4
    assert scaler.state.replicas == 2 and "cores are busy" in last.reason
    assert last.inputs["cores_busy"] == 0.97


def test_idle_cores_or_no_machine_in_the_samples_hold_nothing_back():
    for cores, busy in ((2, 0.5), (0, None), (2, None)):
        scaler = EntityScaler(horizontal_only(), replicas=1)
        _on_machine(cores, busy)(scaler, 1, 12, 40.0)
        assert scaler.state.replicas == 4, (cores, busy)


def test_replicas_already_over_the_cores_are_not_taken_by_the_hold():
    scaler = EntityScaler(horizontal_only(), replicas=3)
    _on_machine(2, 0.99)(scaler, 1, 12, 60.0)  # asks for 6: held at the 3 there are, not cut to 2
    assert scaler.state.replicas == 3


def test_a_step_right_after_quiet_seconds_is_held_by_the_machines_last_seconds():
    # the load steps from 2 to 40 at t=10, and the cores go from 40 % to 100 % busy with it: the scale-up is decided
    # at once, when the decision interval's mean busy share (mostly quiet seconds) is still low
    scaler = EntityScaler(horizontal_only(), replicas=1)
    reasons = []
    for t in range(1, 13):
        load, busy = (2.0, 0.4) if t < 10 else (40.0, 1.0)
        scaler.observe(replace(sample(float(t), load, scaler.state.replicas), cores=2, cores_busy=busy))
        decision = scaler.decide(float(t))
        reasons.append(decision.reason)
        assert scaler.state.replicas <= 2, (t, decision.reason)
    assert scaler.state.replicas == 2 and any("cores are busy" in r for r in reasons)


def test_the_forecast_counts_a_trend_only_when_the_seconds_rise_more_consistently_than_noise():
    from serving.autoscaler.load import forecast

    def seconds(loads):  # loads with a known service time of 0.1 s: requests = load / 0.1
        return tuple(
            Sample(t=float(t), in_flight=x, ready_replicas=1, requests=round(x * 10), completed=1)
            for t, x in enumerate(loads, 1)
        )

    assert forecast(seconds([100, 103, 98, 101, 104]), 0.1, 10.0) == pytest.approx(104)  # noise: the last second
    assert forecast(seconds([100, 110, 120, 130, 140]), 0.1, 10.0) == pytest.approx(140 + 10 * 10)
    assert forecast(seconds([100, 100, 100, 100, 400]), 0.1, 10.0) == pytest.approx(400)  # a step: no trend
    assert forecast(seconds([100, 110]), 0.1, 10.0) is None
