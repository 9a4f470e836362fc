"""The simulator-fidelity benchmark's pure parts: the scenarios, traces from recorded sends, timelines, gaps and
verdicts, the measured profile.

No processes: recorded data is made up here; the live runs themselves are ``python -m benchmarks.fidelity``.
"""

from __future__ import annotations

import itertools
import math
from datetime import datetime

import numpy as np
import pytest

from benchmarks import fidelity as f
from benchmarks import fidelity_scenarios as fs


def records() -> list[f.Record]:
    """8 s at 8 req/s (30 ms answers), then 2 s at 80 req/s: one 429, one 503, one late, one without an answer."""
    base = [f.Record(i / 8, 200, 0.030 + 0.002 * (i % 3)) for i in range(64)]
    step = [f.Record(8 + i / 80, 200, 0.2) for i in range(160)]
    step[10] = f.Record(step[10].sent, 429, 0.001)
    step[11] = f.Record(step[11].sent, 503, 0.01)
    step[12] = f.Record(step[12].sent, 200, 0.9)
    step[13] = f.Record(step[13].sent, None, 30.0)
    return base + step


def test_the_trace_is_the_sorted_send_times_shifted_with_its_step():
    recs = [f.Record(2.0, 200, 0.1), f.Record(-0.001, 200, 0.1), f.Record(1.0, 429, 0.0)]
    trace = f.trace_from_records(recs, step_at=1.5, shift=0.25)
    assert trace.arrivals.tolist() == [0.25, 1.25, 2.25]  # a send a hair before the origin counts at 0
    assert trace.step_at == 1.75 and trace.step_rate == f.STEP_RPS and trace.service_ms is None


def test_bad_is_non_2xx_no_answer_or_over_the_slo():
    recs = records()
    assert [f.is_bad(r) for r in recs[64 + 9 : 64 + 15]] == [False, True, True, True, True, False]
    assert sum(f.is_bad(r) for r in recs) == 4


@pytest.mark.parametrize("boundary, shift", [(3.25, 2.75), (1.93, 4.07), (1.0, 0.0), (-4.5, 0.5)])
def test_the_shift_puts_the_simulators_boundaries_on_the_gateways(boundary, shift):
    decisions = [
        {"t": boundary - 5, "inputs": {"boundary": True}},
        {"t": boundary, "inputs": {"boundary": True}},
        {"t": 9.2, "inputs": {"boundary": False}},
        {"t": 6.0, "inputs": {}},
    ]
    got = f.phase_shift(decisions, before=8.0)
    assert got == pytest.approx(shift)
    # the simulator's boundaries (1 + 5k: its policy starts at the first tick), less the shift, are the gateway's
    off = (1.0 - got - boundary) % 5.0
    assert min(off, 5.0 - off) == pytest.approx(0.0, abs=1e-9)
    assert f.phase_shift([{"t": 9.0, "inputs": {"boundary": False}}], before=8.0) == 0.0


def test_timelines_on_the_live_clock_and_their_summary():
    sim = f.sim_timeline(
        {"t": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "ready": [1, 1, 1, 2, 4, 4], "replicas": [1, 1, 4, 4, 4, 4]}, shift=2.5
    )
    assert sim == f.Timeline([0.5, 1.5, 2.5, 3.5], [1, 2, 4, 4], [4, 4, 4, 4])
    polls = [f.Poll(0.1, 1, 3), f.Poll(0.6, 1, 2), f.Poll(1.4, 2, 1), f.Poll(2.4, 3, 1), f.Poll(3.0, 1, 3)]
    decisions = [{"t": 0.55, "replicas": 3}, {"t": 2.45, "replicas": 2}, {"t": 2.9, "replicas": 1}]  # 2.45: 2.5's tick
    live = f.live_timeline(polls, decisions, sim.t)
    assert live == f.Timeline([0.5, 1.5, 2.5, 3.5], [1, 2, 3, 1], [1, 3, 3, 1])  # before any decision: the ready count
    assert f.time_to_capacity(live, step_at=1.0, per_replica_rps=30.0) == 1.5  # 3 x 30 >= 0.95 x 80
    assert f.time_to_capacity(live, step_at=1.0, per_replica_rps=10.0) is None
    summary = f.summarise(live, step_at=1.0, per_replica_rps=30.0, bad=7, load_end=3.0)
    assert summary == {
        "replica_seconds": 8.0,
        "ready_replica_seconds": 7.0,
        "time_to_capacity_s": 1.5,
        "peak_replicas": 3,
        "bad": 7,
        "back_to_one_s": 0.5,
    }


def test_gaps_and_verdicts():
    assert f.gap(100.0, 115.0) == pytest.approx(0.15) and f.gap(10.0, 7.0) == pytest.approx(-0.3)
    assert f.gap(None, 3.0) is None and f.gap(0.0, 0.0) == 0.0 and f.gap(0, 2) == math.inf
    rows = {
        r["metric"]: r
        for r in f.compare(
            {"replica_seconds": 100.0, "time_to_capacity_s": 2.0, "bad": 10},
            {"replica_seconds": 119.0, "time_to_capacity_s": 2.5, "bad": 40},
            1000,
        )
    }
    assert rows["replica_seconds"]["verdict"] == "PASS" and rows["time_to_capacity_s"]["verdict"] == "FAIL"
    assert rows["bad"]["verdict"] == "FAIL" and rows["bad"]["gap"] == pytest.approx(3.0)  # 30 more, over 1 % of 1000
    assert rows["back_to_one_s"]["gap"] is None and set(rows) == set(f.COMPARED)
    assert rows["peak_replicas"]["verdict"] == "" and set(f.JUDGED) == {"replica_seconds", "time_to_capacity_s", "bad"}


@pytest.mark.parametrize(
    "live, sim, requests, verdict",
    [
        (100, 119, 1662, "PASS"),  # within 20 %
        (100, 79, 1662, "FAIL"),  # 21 % fewer, 21 more: over 20 % and over 16.6
        (5, 21, 1662, "PASS"),  # +320 %, but 16 more: within 1 % of the requests
        (5, 22, 1662, "FAIL"),  # 17 more: neither
        (0, 16, 1662, "PASS"),  # none live: the absolute bound still applies
        (0, 0, 1662, "PASS"),
        (40, 10, 1000, "FAIL"),  # 30 fewer of 1000
        (None, 10, 1000, "FAIL"),  # a side missing
    ],
)
def test_bad_requests_pass_within_20_percent_or_1_percent_of_the_requests(live, sim, requests, verdict):
    judged = {"replica_seconds": 100.0, "time_to_capacity_s": 2.0}
    rows = {r["metric"]: r for r in f.compare({**judged, "bad": live}, {**judged, "bad": sim}, requests)}
    assert rows["bad"]["verdict"] == verdict
    assert rows["replica_seconds"]["verdict"] == rows["time_to_capacity_s"]["verdict"] == "PASS"
    assert all(r["verdict"] == "" for k, r in rows.items() if k not in f.JUDGED)


def stamp(seconds: float) -> str:
    return datetime.fromtimestamp(1_800_000_000 + seconds).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def test_start_and_refill_times_from_the_gateway_log_and_the_decisions():
    origin = 1_800_000_000 + 100.0
    backend = "INFO gateway serving.autoscaler.backends.local: replica pid"
    lines = [
        f"{stamp(100 - 30)} INFO gateway serving.local_replicas: started replica pid 10 for  on port 1",
        f"{stamp(109.0)} INFO gateway serving.local_replicas: started replica pid 11 for models:/rowcost/1 on port 2",
        f"{stamp(109.5)} {backend} 10 added to fidelity/rowcost-1 (2 now)",
        f"{stamp(109.6)} INFO gateway serving.replicas.local: forked replica pid 12 for  on port 3",
        f"{stamp(129.0)} {backend} 11 added to fidelity/rowcost-1 (3 now)",
        f"{stamp(110.0)} {backend} 99 added to other/x-1 (2 now)",
        "  a traceback line",
    ]
    events = f.log_events(lines, origin)
    assert [(round(t, 3), pid, n) for t, pid, n in events["added"]] == [(9.5, 10, 2), (29.0, 11, 3)]
    assert [(round(t, 3), pid, model) for t, pid, model in events["started"]] == [
        (-30.0, 10, False),
        (9.0, 11, True),
        (9.6, 12, False),
    ]
    decisions = [
        {"t": 4.0, "replicas": 1},
        {"t": 9.0, "replicas": 3},
        {"t": 10.0, "replicas": 3},
        {"t": 50.0, "replicas": 1},
    ]
    starts = f.start_times(decisions, events["added"], cold_pids={11})
    assert starts["warm"] == pytest.approx([0.5]) and starts["cold"] == pytest.approx([20.0])
    polls = [f.Poll(t, 1, idle) for t, idle in ((9.0, 0), (9.5, 0), (20.0, 0), (24.5, 1), (25.0, 1))]
    assert f.refill_times(events["started"], polls) == pytest.approx([14.9])


def test_the_profile_from_the_measurements():
    figures = f.service_figures(records(), base_end=8.0, predict=(3.0, 100.0))
    assert figures["service_ms"] == pytest.approx(30.0) and 0.0 < figures["service_sigma"] < 0.1
    assert figures["base_p50_ms"] == pytest.approx(32.0)
    assert f.service_figures(records(), 8.0, (0.0, 0.0))["service_ms"] == pytest.approx(32.0)  # no replica reading
    m = {**figures, "model_load_s": 0.4, "starts": {"warm": [0.5, 0.6, 0.7], "cold": [20.4]}, "refills_s": [15.0]}
    profile = f.measured_profile(m)
    assert (profile.parallelism, profile.slo_ms, profile.max_replicas) == (1, fs.SLO_MS, fs.MAX_REPLICAS)
    assert profile.warm_start_s + profile.model_load_s == pytest.approx(0.6)  # the measured decision-to-ready
    assert profile.cold_start_s + profile.model_load_s == pytest.approx(20.4)
    no_cold = f.measured_profile({**m, "starts": {"warm": [0.5], "cold": []}})
    assert no_cold.cold_start_s == pytest.approx(15.0)  # a standby's refill stands in


def test_metric_sum_reads_prometheus_text():
    text = (
        'tollfree_autoscaler_desired_replicas{endpoint="fidelity",served_entity="a"} 3.0\n'
        'tollfree_autoscaler_desired_replicas{endpoint="other",served_entity="b"} 2.0\n'
        '# HELP tollfree_replica_predict_seconds x\ntollfree_replica_predict_seconds_sum{model_uri="m"} 1.5\n'
    )
    assert f.metric_sum(text, "tollfree_autoscaler_desired_replicas", '"fidelity"') == 3.0
    assert f.metric_sum(text, "tollfree_autoscaler_desired_replicas") == 5.0
    assert f.metric_sum(text, "tollfree_replica_predict_seconds_sum") == 1.5
    assert f.metric_sum(text, "tollfree_replica_model_load_seconds") is None


def test_trace_from_records_feeds_the_simulator():
    trace = f.trace_from_records(records(), step_at=8.0)
    assert len(trace.arrivals) == 224 and np.all(np.diff(trace.arrivals) >= 0)


def test_the_trace_takes_the_scenarios_step_rate_and_time_to_capacity_is_against_it():
    assert f.trace_from_records(records(), step_at=8.0, step_rate=40.0).step_rate == 40.0
    tl = f.Timeline([8.0, 9.0, 10.0], [1, 2, 3], [3, 3, 3])
    assert f.time_to_capacity(tl, 8.0, per_replica_rps=30.0) == 2.0  # 90 >= 0.95 x 80
    assert f.time_to_capacity(tl, 8.0, per_replica_rps=30.0, step_rate=40.0) == 1.0  # 60 >= 0.95 x 40


def test_the_shapes_phases_and_their_step():
    step, ramp, bursty = (fs.load_phases(shape) for shape in ("step", "ramp", "bursty"))
    assert step == [(8.0, 8.0), (80.0, 20.0)]
    assert [sum(s for _, s in p) for p in (step, ramp, bursty)] == [28.0, 36.0, 32.0]
    assert ramp[0] == (8.0, 8.0) and ramp[-1] == (80.0, 8.0) and len(ramp) == 12
    rising = [r for r, _ in ramp[1:11]]
    assert rising == pytest.approx([8 + 7.2 * (k + 1) for k in range(10)]) and rising[-1] == 80.0
    assert all(b > a for a, b in itertools.pairwise(rising)) and {s for _, s in ramp[1:11]} == {2.0}
    assert bursty == [(8.0, 8.0), (80.0, 5.0), (8.0, 7.0), (80.0, 5.0), (8.0, 7.0)]  # two 5-s bursts at 80
    with pytest.raises(ValueError):
        fs.load_phases("sawtooth")
    for shape in fs.SHAPES:
        scenario = fs.Scenario("x", shape, 1, vertical=False, shed=False)
        before = scenario.phases[: scenario.step_index]
        assert sum(s for _, s in before) == scenario.step_at == 8.0 and scenario.step_rate == 80.0
        assert scenario.phases[scenario.step_index][0] > scenario.phases[0][0]  # the step: the first high phase


def test_the_scenarios_cover_each_shape_both_pools_and_the_switches():
    scenarios = fs.SCENARIOS
    assert len(scenarios) == 8 and len({s.name for s in scenarios}) == 8 and fs.BY_NAME["step-pool3"] == scenarios[0]
    assert {s.shape for s in scenarios} == set(fs.SHAPES)
    assert {s.pool for s in scenarios} == {1, 3}
    assert {s.vertical for s in scenarios} == {s.shed for s in scenarios} == {True, False}
    live_test = fs.BY_NAME["step-pool3"]  # the live e2e test's setting
    assert (live_test.shape, live_test.pool, live_test.vertical, live_test.shed) == ("step", 3, False, False)
    for s in scenarios:
        assert s.name.startswith(f"{s.shape}-pool{s.pool}")
        assert ("-vertical" in s.name) == s.vertical and ("-shed" in s.name) == s.shed


def test_the_autoscaling_block_leaves_the_starting_target_to_the_gateway_with_the_vertical_axis_on():
    off = fs.Scenario("a", "step", 3, vertical=False, shed=True).autoscaling
    assert off == {"scale_down_window_s": 20, "initial_target": 1, "vertical": False, "shed_load": True}
    on = fs.Scenario("b", "ramp", 1, vertical=True, shed=False).autoscaling
    assert on == {"scale_down_window_s": 20, "vertical": True, "shed_load": False}


def test_the_replay_runs_the_scenarios_block_at_its_pool_size(monkeypatch):
    profile = f.measured_profile(
        {
            "service_ms": 30.0,
            "service_sigma": 0.05,
            "model_load_s": 0.4,
            "starts": {"warm": [0.5], "cold": [3.0]},
            "refills_s": [],
        }
    )
    seen = {}
    monkeypatch.setattr(f, "simulate", lambda trace, prof, policy, **kw: seen.update(trace=trace, policy=policy))
    for scenario in (fs.BY_NAME["step-pool3"], fs.BY_NAME["bursty-pool1-vertical-shed"]):
        f.replay({"records": records(), "step_at": 8.2}, profile, shift=0.5, scenario=scenario)
        config, policy = seen["policy"].config, seen["policy"]
        assert policy.warm_pool == scenario.pool and config.max_replicas == fs.MAX_REPLICAS
        assert (config.vertical, config.shed_load, config.scale_down_window_s) == (scenario.vertical, scenario.shed, 20)
        assert config.initial_target == 1  # set (vertical off), or seeded from a serial model's profile (on)
        assert seen["trace"].step_at == pytest.approx(8.7) and seen["trace"].step_rate == scenario.step_rate


def test_an_unknown_scenario_is_refused_naming_it_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_info:
        f.main(["--scenarios", "step-pool3,stepp-pool9"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "stepp-pool9" in err and "--list" in err
