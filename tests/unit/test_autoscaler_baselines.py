"""Each baseline reproduces its documented behaviour, stepped by hand through simulator views."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from serving.autoscaler.signals import Sample
from simulator import traces as tr
from simulator.baselines import HPA, KPA, KPA_TIMEOUT_S, RayServe
from simulator.engine import View, simulate
from simulator.profiles import PRESETS


def second(t: float, in_flight: float, ready: int) -> View:
    s = Sample(t=t, in_flight=in_flight, ready_replicas=ready, replicas=ready)
    return View(now=t, in_flight=int(in_flight), queued=0, ready=ready, provisioned=ready, second=s)


def drive_seconds(policy, start: int, end: int, load, replicas: list[int]) -> None:
    """One view a second; every replica asked for is ready at once (isolates the decision logic)."""
    for t in range(start, end):
        action = policy.step(second(float(t), load(t) if callable(load) else load, replicas[0]))
        if action is not None and action.replicas is not None:
            replicas[0] = action.replicas


def test_hpa_holds_replicas_for_300_s_after_a_drop():
    hpa = HPA(target=10.0)
    replicas = [hpa.initial(100.0)[0]]
    assert replicas == [10]
    drive_seconds(hpa, 0, 60, 100.0, replicas)
    drive_seconds(hpa, 60, 340, 10.0, replicas)
    assert replicas == [10]  # the max of the last 300 s of recommendations
    drive_seconds(hpa, 340, 400, 10.0, replicas)
    assert replicas == [1]


def test_hpa_scale_up_is_limited_to_double_or_four_pods_per_15_s():
    hpa = HPA(target=10.0)
    replicas = [hpa.initial(20.0)[0]]
    history = []
    for t in range(61):
        action = hpa.step(second(float(t), 1000.0, replicas[0]))
        if action is not None:
            replicas[0] = action.replicas
            history.append((t, action.replicas))
    assert history == [(0, 6), (15, 12), (30, 24), (45, 48), (60, 96)]


def test_hpa_tolerance_and_missing_pods():
    hpa = HPA(target=10.0)
    hpa.initial(100.0)
    assert hpa.step(second(0.0, 105.0, 10)) is None  # within 10 %
    hpa.spec = 6  # 4 ready, 2 still starting (no metrics)
    view = View(
        now=15.0,
        in_flight=48,
        queued=0,
        ready=4,
        provisioned=6,
        second=Sample(t=15.0, in_flight=48.0, ready_replicas=4),
    )
    # 12 a ready pod (ratio 1.2); the 2 missing count as 0 on a scale-up: 48 / 60 = 0.8 flips -> hold
    assert hpa.step(view) is None


def test_kpa_panics_on_a_burst_and_does_not_scale_down_while_panicking():
    kpa = KPA()
    assert kpa.target == 70.0
    replicas = [kpa.initial(70.0)[0]]
    drive_seconds(kpa, 0, 70, 60.0, replicas)
    assert replicas == [1]
    drive_seconds(kpa, 70, 76, 700.0, replicas)  # 10x: the 6 s panic window sees it within a tick
    assert kpa.panic_time is not None and replicas[0] >= 5
    peak = replicas[0]
    drive_seconds(kpa, 76, 120, 60.0, replicas)  # load gone, still panicking: no scale-down
    assert replicas[0] >= peak
    drive_seconds(kpa, 120, 200, 60.0, replicas)  # 60 s after the last over-threshold: stable mode
    assert kpa.panic_time is None and replicas[0] < peak


def test_kpa_scales_to_zero_after_the_stable_window_and_the_grace_period():
    kpa = KPA()
    replicas = [kpa.initial(50.0)[0]]
    drive_seconds(kpa, 0, 10, 50.0, replicas)
    drive_seconds(kpa, 10, 95, 0.0, replicas)  # the 60 s window still averages some load
    assert replicas == [1]
    drive_seconds(kpa, 95, 110, 0.0, replicas)
    assert replicas == [0]


def test_ray_waits_for_the_upscale_delay_and_the_downscale_delay():
    ray = RayServe()
    target, limit = ray.initial(4.0)
    assert (target, limit) == (2, 5)
    replicas = [target]
    up_at = None
    for k in range(700):  # 0.1 s control loop
        t = k / 10
        action = ray.step(View(now=t, in_flight=40, queued=0, ready=replicas[0], provisioned=replicas[0], second=None))
        if action is not None:
            replicas[0] = action.replicas
            up_at = up_at or t
    assert up_at is not None and 30.0 <= up_at <= 31.0  # > int(30 / 0.1) consecutive periods
    down_at = None
    for k in range(700, 700 + 6200):
        t = k / 10
        action = ray.step(View(now=t, in_flight=2, queued=0, ready=replicas[0], provisioned=replicas[0], second=None))
        if action is not None:
            down_at = t
            break
    assert down_at is not None and down_at - 70.0 >= 600.0


# -- each baseline's request path at its defaults, through the engine ---------------------------------


def overload(rps: float = 400.0, seconds: float = 120.0):
    return tr.from_rate("overload", lambda t: np.full_like(t, rps), seconds, seed=5)


def test_kpa_default_has_no_queue_limit_so_its_concurrency_passes_the_target_and_it_scales():
    # containerConcurrency 0: no queue-proxy breaker; a 4-slot model at 400 req/s on one pod builds a
    # backlog in the pod (not rejections), the observed concurrency passes 70, and KPA adds pods
    profile = PRESETS["cpu"]
    r = simulate(overload(), profile, KPA(), seed=5, timeline=True)
    assert r.rejected == 0
    assert max(r.timeline["replicas"]) > 1
    assert r.over_slo > 0  # the wait in the pod is paid in latency


def test_kpa_requests_time_out_after_the_revision_timeout():
    profile = replace(PRESETS["cpu"], max_replicas=1)  # no pod can be added: the backlog only grows
    r = simulate(overload(rps=200.0, seconds=400.0), profile, KPA(), seed=5, timeline=False)
    assert r.rejected > 0  # the 504s after 300 s
    assert r.p99_ms <= KPA_TIMEOUT_S * 1000 + 1000


def test_kpa_with_container_concurrency_queues_ten_times_it_per_pod():
    kpa = KPA(container_concurrency=4)
    assert kpa.replica_queue == 40 and kpa.target == pytest.approx(2.8)
    assert KPA().replica_queue is None  # the pod's own (unbounded) room


def test_ray_queues_without_limit_at_the_router_and_hpa_in_the_pod():
    profile = PRESETS["cpu"]
    spike = tr.spike(base_rps=100.0, seed=5)  # 10x within 5 s: both fall behind for a while
    for policy in (RayServe(), HPA(target=profile.user_target)):
        r = simulate(spike, profile, policy, seed=5, timeline=False)
        assert r.rejected == 0 and r.over_slo > 0
    # a model server that does limit its waiting room (a profile sets one) rejects past it under HPA
    limited = replace(profile, queue_limit=8)
    r = simulate(spike, limited, HPA(target=profile.user_target), seed=5, timeline=False)
    assert r.rejected > 0
