"""Controller logic with fake signal sources and backends (pure logic: no processes involved)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import Controller, RetryPolicy
from serving.autoscaler.signals import Sample

KEY = ("fraud", "champion")


class Source:
    def __init__(self) -> None:
        self.in_flight = 0.0
        self.ready = 1

    def sample(self, now: float):
        busy = self.in_flight
        return {
            KEY: Sample(
                t=now,
                in_flight=busy,
                ready_replicas=self.ready,
                replicas=self.ready,
                requests=int(busy * 10),
                completed=int(busy * 10),
                latency_p99_ms=20.0,
            )
        }


class FlakyBackend:
    """Fails the first ``failures`` calls to set_replicas; records every call."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[float, int]] = []
        self.replicas = 1
        self.ready = 1
        self.now = 0.0

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        self.calls.append((self.now, n))
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("api unavailable")
        self.replicas = n

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        return self.ready


def step(controller: Controller, backend: FlakyBackend, start: int, end: int) -> None:
    for t in range(start, end):
        backend.now = float(t)
        controller.step(float(t))


def config(**kw) -> ScalingConfig:
    return ScalingConfig(vertical=False, initial_target=10.0, **kw)


def test_a_failing_backend_is_retried_with_exponential_backoff_then_applied():
    source, backend = Source(), FlakyBackend(failures=3)
    controller = Controller(source, backend, {KEY: config()}, retry=RetryPolicy(base_s=1.0, max_s=30.0))
    source.in_flight = 50.0
    step(controller, backend, 1, 20)
    times = [t for t, n in backend.calls if n == 5]
    assert times[:4] == [1.0, 2.0, 4.0, 8.0]  # a surge: first try at once, then +1 s, +2 s, +4 s
    assert backend.replicas == 5
    failed = [r for r in controller.export() if r["applied"] is False]
    assert len(failed) == 3 and all("ConnectionError" in r["error"] for r in failed)
    assert controller.apply_failures[KEY] == 3


def test_never_asks_for_fewer_than_the_provisioned_minimum():
    source, backend = Source(), FlakyBackend()
    controller = Controller(source, backend, {KEY: config(min_replicas=2, provisioned_concurrency=30)})
    source.in_flight = 0.0
    step(controller, backend, 1, 400)
    assert backend.calls and min(n for _, n in backend.calls) >= 3
    assert all(r["replicas"] >= 3 for r in controller.export())


def test_a_lost_replica_below_the_minimum_is_reapplied():
    source, backend = Source(), FlakyBackend()
    controller = Controller(source, backend, {KEY: config(min_replicas=2)}, reconcile_s=10.0)
    step(controller, backend, 1, 10)
    first = len(backend.calls)
    backend.ready = 1  # one of the two died
    step(controller, backend, 10, 40)
    assert len(backend.calls) > first and backend.calls[-1][1] == 2


def test_a_backend_left_above_the_applied_count_is_reapplied():
    source, backend = Source(), FlakyBackend()
    controller = Controller(source, backend, {KEY: config()}, reconcile_s=10.0)
    step(controller, backend, 1, 10)
    first = len(backend.calls)
    backend.ready = 3  # replicas the backend kept after a scale-down to one
    step(controller, backend, 10, 40)
    again = backend.calls[first:]
    assert again and all(n == 1 for _, n in again)
    assert 2 <= len(again) <= 4  # every reconcile_s, not every second


def test_the_queue_bound_of_every_decision_reaches_the_queue_sink():
    source, backend = Source(), FlakyBackend()
    bounds: list[tuple[str, str, int]] = []
    controller = Controller(source, backend, {KEY: config()}, queue_sink=lambda e, n, q: bounds.append((e, n, q)))
    source.in_flight = 5.0
    decisions = []
    for t in range(1, 30):
        backend.now = float(t)
        decisions += controller.step(float(t))
    assert [b[2] for b in bounds] == [d.queue_limit for d in decisions]
    assert {b[:2] for b in bounds} == {KEY}
    assert bounds[-1][2] < config().max_queue  # serving at a measured rate: bounded below max_queue


def test_decisions_are_recorded_with_their_inputs_and_exported():
    source, backend = Source(), FlakyBackend()
    controller = Controller(source, backend, {KEY: config()}, history_size=5)
    source.in_flight = 42.0
    step(controller, backend, 1, 60)
    records = controller.export()
    assert len(records) == 5  # bounded
    assert {"t", "replicas", "target_concurrency", "inputs", "reason", "applied"} <= set(records[-1])
    assert "load_up" in records[-1]["inputs"]
    registry = CollectorRegistry()
    registry.register(controller.collector())
    text = generate_latest(registry).decode()
    assert 'tollfree_autoscaler_desired_replicas{endpoint="fraud",served_entity="champion"} 5.0' in text
    assert "tollfree_autoscaler_apply_failures_total" in text


def test_the_concurrency_limit_reaches_the_gateway_hook():
    source, backend = Source(), FlakyBackend()
    limits = []
    controller = Controller(
        source,
        backend,
        {KEY: ScalingConfig(initial_target=8.0)},
        concurrency_sink=lambda e, s, n: limits.append((e, s, n)),
    )
    step(controller, backend, 1, 3)
    assert limits == [("fraud", "champion", 12)]  # ceil(8 x 1.5), sent once


def test_a_scale_to_zero_entity_keeps_the_replica_it_was_deployed_with_until_its_idle_window_has_passed():
    # a rollout starts one replica even at min_replicas 0; the policy starts from that replica, not from
    # the minimum (the old start from 0 stopped the new replica at the controller's first step)
    source, backend = Source(), FlakyBackend()
    controller = Controller(source, backend, {})
    controller.set_config(
        KEY, config(min_replicas=0, scale_to_zero=True, idle_window_s=30.0, scale_down_window_s=30.0), replicas=1
    )
    step(controller, backend, 1, 30)
    assert [n for _, n in backend.calls if n == 0] == [] and backend.replicas == 1
    step(controller, backend, 30, 40)
    zero = [t for t, n in backend.calls if n == 0]
    assert zero and 30.0 <= zero[0] <= 36.0  # at the first 5-s decision once 30 s have been idle
    assert backend.replicas == 0


def test_the_ready_gauge_shows_the_count_after_the_apply():
    class DrainingBackend(FlakyBackend):
        def ready_replicas(self, endpoint: str, entity: str) -> int:
            return self.replicas  # a scale-down leaves the routing at once

    source, backend = Source(), DrainingBackend()
    controller = Controller(source, backend, {})
    controller.set_config(
        KEY, config(min_replicas=0, scale_to_zero=True, idle_window_s=20.0, scale_down_window_s=20.0), replicas=1
    )
    registry = CollectorRegistry()
    registry.register(controller.collector())
    t = 0
    while backend.replicas and t < 60:  # up to and including the step that applies 0, none after
        t += 1
        step(controller, backend, t, t + 1)
    assert backend.replicas == 0 and controller.export()[-1]["ready_replicas"] == 1  # the decision saw 1
    gauge = 'tollfree_autoscaler_ready_replicas{endpoint="fraud",served_entity="champion"} '
    assert gauge + "0.0" in generate_latest(registry).decode()


def test_since_reads_an_endpoints_newest_decisions_only():
    from serving.autoscaler.controller import DecisionRecord

    controller = Controller(None, None, {})  # type: ignore[arg-type]  (no step: the history is given)
    for t in range(10):
        for endpoint in ("a", "b"):
            controller.history.append(DecisionRecord(float(t), endpoint, "main", t, 1.0, 2, "why", t))
    assert [d["t"] for d in controller.since("a", 6.0, 10)] == [7.0, 8.0, 9.0]
    assert [d["t"] for d in controller.since("b", -1.0, 2)] == [8.0, 9.0]  # the newest, oldest first
    assert controller.since("c", -1.0, 10) == []
