"""The controller: collect signals, decide, apply through an actuator, record every decision.

Two narrow seams (the gateway and the simulator plug in here):

* :class:`SignalSource` -- ``sample(now) -> {(endpoint, entity): Sample}``: one per-second sample per
  served entity (in-flight requests incl. queued, per-replica in-flight, latency p50/p99 over the last
  second, queue depth, utilisation/CPU, memory). See :class:`serving.autoscaler.signals.Sample`.
* :class:`Actuator` -- ``set_replicas(endpoint, entity, n)`` and ``ready_replicas(endpoint, entity)``.
  ``set_replicas`` may raise; the controller logs it and retries with exponential backoff.

Two optional sinks take the decision's per-entity limits: ``concurrency_sink`` the per-replica admission
limit (when it changes), ``queue_sink`` the gateway queue bound (every step).

:class:`EntityScaler` is the per-entity stepper (history + policy state). The simulator drives the very
same class, so simulated and live decisions come from one code path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.policy import Decision, PolicyState, decide, floor_replicas
from serving.autoscaler.signals import Sample, SampleHistory

log = logging.getLogger(__name__)

EntityKey = tuple[str, str]  # (endpoint, served entity)


class SignalSource(Protocol):
    """Where samples come from (the gateway's in-flight counters and the replicas' reports)."""

    def sample(self, now: float) -> Mapping[EntityKey, Sample]:
        """One sample per served entity for the second ending at ``now``."""
        ...


class Actuator(Protocol):
    """What applies a replica count: in the gateway each served entity's replica set (whose replicas are local
    processes or Kubernetes pods), or the simulator."""

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        """Ask for ``n`` replicas; may raise on failure (the controller retries)."""
        ...

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        """How many replicas are ready to serve now."""
        ...


class EntityScaler:
    """One served entity's autoscaler: its sample history and policy state. ``observe`` then ``decide``."""

    def __init__(self, config: ScalingConfig, replicas: int | None = None, serves: float | None = None) -> None:
        self.config = config
        self.history = SampleHistory(keep_s=config.scale_down_window_s + config.vertical_interval_s + 1)
        self.state = PolicyState.initial(config, replicas, serves)

    def observe(self, sample: Sample) -> None:
        self.history.add(sample)

    def decide(self, now: float) -> Decision:
        decision, self.state = decide(self.config, self.history.snapshot(), self.state, now)
        return decision

    @property
    def floor(self) -> int:
        return floor_replicas(self.config, self.state.target)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff for failed applies: ``base_s x 2^(attempt-1)``, capped at ``max_s``."""

    base_s: float = 0.5
    max_s: float = 30.0

    def delay(self, attempt: int) -> float:
        return min(self.max_s, self.base_s * (2 ** max(0, attempt - 1)))


@dataclass(frozen=True)
class DecisionRecord:
    """One decision with its inputs and what happened when it was applied."""

    t: float
    endpoint: str
    entity: str
    replicas: int
    target_concurrency: float
    max_concurrency: int
    reason: str
    ready_replicas: int
    inputs: Mapping[str, Any] = field(default_factory=dict)
    applied: bool | None = None  # None: nothing to apply
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["inputs"] = dict(self.inputs)
        return d


@dataclass
class _PendingApply:
    """A replica count the backend has yet to take (``set_replicas``), retried with backoff until it does."""

    replicas: int
    attempts: int = 0
    next_at: float = 0.0


class Controller:
    """Runs the loop for a set of served entities. ``step(now)`` is one iteration; ``run`` loops it."""

    def __init__(
        self,
        source: SignalSource,
        actuator: Actuator,
        configs: Mapping[EntityKey, ScalingConfig],
        *,
        retry: RetryPolicy = RetryPolicy(),
        history_size: int = 2000,
        concurrency_sink: Callable[[str, str, int], None] | None = None,
        queue_sink: Callable[[str, str, int], None] | None = None,
        reconcile_s: float = 30.0,
    ) -> None:
        self.source = source
        self.actuator = actuator
        self.retry = retry
        self.concurrency_sink = concurrency_sink
        self.queue_sink = queue_sink
        self.scalers: dict[EntityKey, EntityScaler] = {k: EntityScaler(c) for k, c in configs.items()}
        self.history: deque[DecisionRecord] = deque(maxlen=history_size)
        self._applied: dict[EntityKey, int] = {}
        self._pending: dict[EntityKey, _PendingApply] = {}
        self._limits: dict[EntityKey, int] = {}
        self.apply_failures: dict[EntityKey, int] = {}
        self.decisions_total: dict[EntityKey, int] = {}
        self._ready: dict[EntityKey, int] = {}
        self._applied_at: dict[EntityKey, float] = {}
        self.reconcile_s = reconcile_s
        self._lock = threading.Lock()

    def set_config(
        self, key: EntityKey, config: ScalingConfig, replicas: int | None = None, serves: float | None = None
    ) -> None:
        """Add a served entity or replace its config (the learned target and replica count carry over).

        ``replicas``: what a new entity was deployed with (a rollout starts at least one, as Knative
        starts a revision at its initial scale); the policy starts from it, not from ``min_replicas``,
        so a scale-to-zero entity leaves only after its idle window, not at the first step. ``serves``:
        what one replica predicts at once, as measured (the horizontal axis counts no more a replica)."""
        with self._lock:
            old = self.scalers.get(key)
            scaler = EntityScaler(config, replicas, serves)
            if old is not None:
                scaler.history = old.history
                scaler.state = PolicyState(
                    replicas=old.state.replicas,
                    serves=serves or old.state.serves,
                    target=min(config.max_target, max(config.min_target, old.state.target)),
                )
            self.scalers[key] = scaler

    def resume(self, key: EntityKey, state: PolicyState, samples: list[Sample], now: float) -> None:
        """Continue a served entity from a recorded state and samples (another gateway's, or this one's
        before a restart) instead of from scratch; the entity must have been added with ``set_config``.
        Samples not before ``now`` (another machine's clock ahead of ours) are left out."""
        with self._lock:
            scaler = self.scalers[key]
            scaler.state = state
            last = scaler.history.snapshot().last
            for sample in samples:
                if sample.t < now and (last is None or sample.t > last.t):
                    scaler.history.add(sample)
                    last = sample

    def snapshot(self) -> dict[EntityKey, tuple[PolicyState, tuple[Sample, ...]]]:
        """Each entity's policy state and recent samples (what ``resume`` takes)."""
        with self._lock:
            return {key: (s.state, s.history.snapshot().samples) for key, s in self.scalers.items()}

    def remove(self, key: EntityKey) -> None:
        with self._lock:
            self.scalers.pop(key, None)
            self._pending.pop(key, None)
            self._applied.pop(key, None)
            self._limits.pop(key, None)

    def step(self, now: float) -> list[Decision]:
        """Collect one sample per entity, decide, apply what changed (retrying failed applies)."""
        samples = self.source.sample(now)
        out = []
        with self._lock:
            for key, scaler in self.scalers.items():
                sample = samples.get(key)
                if sample is not None:
                    scaler.observe(sample)
                decision = scaler.decide(now)
                out.append(decision)
                self._act(key, scaler, decision, now)
        return out

    def _act(self, key: EntityKey, scaler: EntityScaler, decision: Decision, now: float) -> None:
        endpoint, entity = key
        wanted = max(decision.replicas, scaler.floor)  # never below the provisioned minimum
        try:
            ready = self.actuator.ready_replicas(endpoint, entity)
        except Exception as exc:
            log.warning("autoscaler: ready_replicas failed for %s/%s: %s", endpoint, entity, type(exc).__name__)
            ready = self._ready.get(key, 0)
        self._ready[key] = ready
        if self.concurrency_sink is not None and self._limits.get(key) != decision.max_concurrency:
            try:
                self.concurrency_sink(endpoint, entity, decision.max_concurrency)
                self._limits[key] = decision.max_concurrency
            except Exception as exc:
                log.warning("autoscaler: concurrency update failed for %s/%s: %s", endpoint, entity, type(exc).__name__)
        if self.queue_sink is not None:  # every step: the bound moves with the measured throughput
            try:
                self.queue_sink(endpoint, entity, decision.queue_limit)
            except Exception as exc:
                log.warning("autoscaler: queue bound update failed for %s/%s: %s", endpoint, entity, type(exc).__name__)
        pending = self._pending.get(key)
        # a new desired count needs an apply; so does an actuator that stays below the floor (a replica
        # died) or above the count applied (one came up after a scale-down, or was scaled by hand):
        # the same count is re-applied every ``reconcile_s`` until the actuator agrees
        applied_n = self._applied.get(key)
        drifted = ready < scaler.floor or (applied_n is not None and ready > applied_n)
        lost = drifted and now - self._applied_at.get(key, now) >= self.reconcile_s
        if (applied_n != wanted or lost) and (pending is None or pending.replicas != wanted):
            pending = self._pending[key] = _PendingApply(replicas=wanted, attempts=0, next_at=now)
        applied: bool | None = None
        error: str | None = None
        if pending is not None and now >= pending.next_at - 1e-9:
            pending.attempts += 1
            try:
                self.actuator.set_replicas(endpoint, entity, pending.replicas)
            except Exception as exc:
                applied, error = False, f"{type(exc).__name__}: {exc}"[:200]
                self.apply_failures[key] = self.apply_failures.get(key, 0) + 1
                delay = self.retry.delay(pending.attempts)
                pending.next_at = now + delay
                log.warning(
                    "autoscaler: set_replicas(%s/%s, %d) failed (attempt %d), retry in %.1fs: %s",
                    endpoint,
                    entity,
                    pending.replicas,
                    pending.attempts,
                    delay,
                    type(exc).__name__,
                )
            else:
                applied = True
                self._applied[key] = pending.replicas
                self._applied_at[key] = now
                del self._pending[key]
                try:  # the gauge shows the count after the apply (replicas removed leave the routing at once)
                    self._ready[key] = self.actuator.ready_replicas(endpoint, entity)
                except Exception as exc:
                    log.warning("autoscaler: ready_replicas failed for %s/%s: %s", endpoint, entity, type(exc).__name__)
        if decision.horizontal or decision.vertical or applied is not None:
            self.decisions_total[key] = self.decisions_total.get(key, 0) + 1
            self.history.append(
                DecisionRecord(
                    t=now,
                    endpoint=endpoint,
                    entity=entity,
                    replicas=wanted,
                    target_concurrency=decision.target_concurrency,
                    max_concurrency=decision.max_concurrency,
                    reason=decision.reason,
                    ready_replicas=ready,
                    inputs=dict(decision.inputs),
                    applied=applied,
                    error=error,
                )
            )

    def run(
        self, stop: threading.Event, *, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Loop ``step`` every ``interval_s`` until ``stop`` is set (the live entry point)."""
        next_at = clock()
        while not stop.is_set():
            try:
                self.step(clock())
            except Exception:
                log.exception("autoscaler: step failed")
            next_at += interval_s
            stop.wait(max(0.0, next_at - clock()))

    def export(self, limit: int | None = None) -> list[dict[str, Any]]:
        """The recorded decisions as plain dicts, oldest first (for the metrics API and plots)."""
        with self._lock:
            records = list(self.history)
        if limit is not None:
            records = records[-limit:]
        return [r.as_dict() for r in records]

    def since(self, endpoint: str, after: float, limit: int) -> list[dict[str, Any]]:
        """The endpoint's decisions later than ``after`` (this controller's clock), oldest first, at most the
        ``limit`` newest: read from the newest back, so a caller that polls pays for what is new only."""
        found: list[DecisionRecord] = []
        with self._lock:
            for record in reversed(self.history):
                if record.t <= after or len(found) >= limit:
                    break
                if record.endpoint == endpoint:
                    found.append(record)
        return [r.as_dict() for r in reversed(found)]

    def collector(self) -> Collector:
        """A prometheus_client collector of the controller's gauges and counters."""
        return _ControllerCollector(self)


class _ControllerCollector(Collector):
    def __init__(self, controller: Controller) -> None:
        self.c = controller

    def collect(self) -> Iterator[Any]:
        labels = ["endpoint", "served_entity"]
        desired = GaugeMetricFamily(
            "tollfree_autoscaler_desired_replicas", "Replicas the autoscaler asks for", labels=labels
        )
        ready = GaugeMetricFamily(
            "tollfree_autoscaler_ready_replicas", "Replicas the actuator reports ready", labels=labels
        )
        target = GaugeMetricFamily(
            "tollfree_autoscaler_target_concurrency", "Learned per-replica target concurrency", labels=labels
        )
        decisions = CounterMetricFamily("tollfree_autoscaler_decisions", "Decisions recorded", labels=labels)
        failures = CounterMetricFamily(
            "tollfree_autoscaler_apply_failures", "Failed replica count applies", labels=labels
        )
        with self.c._lock:
            for key, scaler in self.c.scalers.items():
                lv = list(key)
                desired.add_metric(lv, max(scaler.state.replicas, scaler.floor))
                ready.add_metric(lv, self.c._ready.get(key, 0))
                target.add_metric(lv, scaler.state.target)
                decisions.add_metric(lv, self.c.decisions_total.get(key, 0))
                failures.add_metric(lv, self.c.apply_failures.get(key, 0))
        yield from (desired, ready, target, decisions, failures)
