"""Each baseline reproduces its documented behaviour, stepped by hand through simulator views."""

from __future__ import annotations

from serving.autoscaler.signals import Sample
from serving.autoscaler.simulate.baselines import HPA, KPA, RayServe
from serving.autoscaler.simulate.engine import View


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
    assert replicas == [10]             # the max of the last 300 s of recommendations
    drive_seconds(hpa, 340, 400, 10.0, replicas)
    assert replicas == [1]


def test_hpa_scale_up_is_limited_to_double_or_four_pods_per_15_s():
    hpa = HPA(target=10.0)
    replicas = [hpa.initial(20.0)[0]]
    history = []
    for t in range(0, 61):
        action = hpa.step(second(float(t), 1000.0, replicas[0]))
        if action is not None:
            replicas[0] = action.replicas
            history.append((t, action.replicas))
    assert history == [(0, 6), (15, 12), (30, 24), (45, 48), (60, 96)]


def test_hpa_tolerance_and_missing_pods():
    hpa = HPA(target=10.0)
    hpa.initial(100.0)
    assert hpa.step(second(0.0, 105.0, 10)) is None    # within 10 %
    hpa.spec = 6                                        # 4 ready, 2 still starting (no metrics)
    view = View(now=15.0, in_flight=48, queued=0, ready=4, provisioned=6,
                second=Sample(t=15.0, in_flight=48.0, ready_replicas=4))
    # 12 a ready pod (ratio 1.2); the 2 missing count as 0 on a scale-up: 48 / 60 = 0.8 flips -> hold
    assert hpa.step(view) is None


def test_kpa_panics_on_a_burst_and_does_not_scale_down_while_panicking():
    kpa = KPA()
    assert kpa.target == 70.0
    replicas = [kpa.initial(70.0)[0]]
    drive_seconds(kpa, 0, 70, 60.0, replicas)
    assert replicas == [1]
    drive_seconds(kpa, 70, 76, 700.0, replicas)       # 10x: the 6 s panic window sees it within a tick
    assert kpa.panic_time is not None and replicas[0] >= 5
    peak = replicas[0]
    drive_seconds(kpa, 76, 120, 60.0, replicas)       # load gone, still panicking: no scale-down
    assert replicas[0] >= peak
    drive_seconds(kpa, 120, 200, 60.0, replicas)      # 60 s after the last over-threshold: stable mode
    assert kpa.panic_time is None and replicas[0] < peak


def test_kpa_scales_to_zero_after_the_stable_window_and_the_grace_period():
    kpa = KPA()
    replicas = [kpa.initial(50.0)[0]]
    drive_seconds(kpa, 0, 10, 50.0, replicas)
    drive_seconds(kpa, 10, 95, 0.0, replicas)          # the 60 s window still averages some load
    assert replicas == [1]
    drive_seconds(kpa, 95, 110, 0.0, replicas)
    assert replicas == [0]


def test_ray_waits_for_the_upscale_delay_and_the_downscale_delay():
    ray = RayServe()
    target, limit = ray.initial(4.0)
    assert (target, limit) == (2, 5)
    replicas = [target]
    up_at = None
    for k in range(0, 700):                             # 0.1 s control loop
        t = k / 10
        action = ray.step(View(now=t, in_flight=40, queued=0, ready=replicas[0], provisioned=replicas[0], second=None))
        if action is not None:
            replicas[0] = action.replicas
            up_at = up_at or t
    assert up_at is not None and 30.0 <= up_at <= 31.0   # > int(30 / 0.1) consecutive periods
    down_at = None
    for k in range(700, 700 + 6200):
        t = k / 10
        action = ray.step(View(now=t, in_flight=2, queued=0, ready=replicas[0], provisioned=replicas[0], second=None))
        if action is not None:
            down_at = t
            break
    assert down_at is not None and down_at - 70.0 >= 600.0
