"""The two-axis policy: pure ``decide(config, signals, state, now) -> (decision, state)``.

No clock reads, no I/O, no randomness: the caller passes ``now`` and the signals (one sample a second)
and keeps the returned state. Each axis acts when its interval has passed.

Horizontal (every ``decision_interval_s``): ``desired = ceil(load / target)``, the load being the max of
the seconds' loads (``load.py``) over ``scale_up_window_s`` to scale up and over ``scale_down_window_s``
to scale down, with tolerance bands against flapping. A surge (the last second's load over ``SURGE``
x the replicas' capacity, Knative's panic threshold) is decided at once; one still rising is sized for
where it heads within a decision interval. The last replica leaves only through the idle window. An
entity fed by a stream also gets the replicas that drain the stream's backlog within its ``max_lag_s`` at
the throughput a replica reaches now (``_stream_drain``), when that is more. Replicas that share one
machine (local ones: ``Sample.cores``) do not grow past its cores while they are busy (``_held_at_cores``):
a process more gets no CPU there, and its start takes CPU from those that serve.

Vertical (every ``vertical_interval_s``, ``vertical.py``): the per-replica target concurrency, the
horizontal's denominator. The gateway's admission limit is ``target x admission_headroom`` and, with
``shed_load``, its queue holds what the measured throughput answers within the latency goal.

Every rule is a named constant or helper; benchmarks/README.md's ablation table is the evidence for each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.load import max_load, queue_bound, recent_service_s, rising
from serving.autoscaler.signals import Signals
from serving.autoscaler.vertical import LATENCY_GOAL, retune

SURGE = 1.5                   # a 1-s load above this many times capacity is decided at once
BACKLOG_SLACK = 0.1           # a stream backlog that needs at most this share more throughput: no replica added
CORES_BUSY = 0.9              # a machine whose cores were this busy over its last HOLD_WINDOW_S has none to spare
HOLD_WINDOW_S = 1.0           # the machine's busy share is read over its last second, as a surge is decided


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between calls."""

    replicas: int
    target: float
    started_at: Optional[float] = None
    last_horizontal: Optional[float] = None
    last_vertical: Optional[float] = None
    last_busy: Optional[float] = None     # last time a request arrived or was in flight
    latency_stressed: bool = False
    queue_stressed: bool = False
    utilisation_high: bool = False
    ceiling: Optional[float] = None       # a target that caused stress: increases stay below it

    @classmethod
    def initial(cls, config: ScalingConfig, replicas: Optional[int] = None) -> "PolicyState":
        start = config.min_replicas if replicas is None else replicas
        return cls(replicas=start, target=config.initial_target)


@dataclass(frozen=True)
class Decision:
    """The replica count and per-replica concurrency to apply, and why."""

    replicas: int
    target_concurrency: float
    max_concurrency: int                  # per-replica admission limit for the gateway
    queue_limit: int                      # gateway queue bound: what can wait without missing the SLO
    horizontal: bool                      # a horizontal decision was taken in this call
    vertical: bool                        # a vertical decision was taken in this call
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)


def max_concurrency_for(config: ScalingConfig, target: float) -> int:
    """The admission limit the gateway enforces for a target: ``ceil(target x admission_headroom)``."""
    return max(1, math.ceil(target * config.admission_headroom - 1e-9))


def floor_replicas(config: ScalingConfig, target: float) -> int:
    """The provisioned minimum: ``min_replicas``, and enough replicas for ``provisioned_concurrency``."""
    return min(config.max_replicas, max(config.min_replicas, math.ceil(config.provisioned_concurrency / target - 1e-9)))


def decide(config: ScalingConfig, signals: Signals, state: PolicyState, now: float) -> tuple[Decision, PolicyState]:
    """One policy step at ``now``. Pure: same inputs, same outputs."""
    last = signals.last
    if state.started_at is None:
        state = replace(state, started_at=now, last_busy=now)
    busy_now = last is not None and (last.requests > 0 or last.in_flight > 0)
    if busy_now:
        state = replace(state, last_busy=max(last.t, state.last_busy or last.t))
    inputs: dict[str, Any] = {}
    vertical = config.vertical and _due(state.last_vertical, state.started_at, config.vertical_interval_s, now)
    if vertical:
        state, vinputs = retune(config, signals, state, now)
        inputs.update(vinputs)
    reason = "hold"
    surge = state.replicas > 0 and _surge(config, signals, state, now)
    due = _due(state.last_horizontal, state.started_at, config.decision_interval_s, now)
    horizontal = (state.replicas == 0 and busy_now) or surge or due
    if horizontal:
        # between boundaries a surge is sized from the last seconds; on a boundary the windows decide
        desired, reason, hinputs = _horizontal(config, signals, state, now, surge=surge and not due)
        inputs.update(hinputs)
        state = replace(state, replicas=desired, last_horizontal=now)
    decision = Decision(
        replicas=state.replicas, target_concurrency=state.target,
        max_concurrency=max_concurrency_for(config, state.target),
        queue_limit=queue_bound(config, signals, now, LATENCY_GOAL),
        horizontal=horizontal, vertical=vertical, reason=reason, inputs=inputs,
    )
    return decision, state


def _due(last: Optional[float], started: Optional[float], interval: float, now: float) -> bool:
    """An axis acts once ``interval`` has passed since it last acted (or since the policy started)."""
    ref = last if last is not None else started
    return ref is not None and now - ref >= interval - 1e-9


def _surge(config: ScalingConfig, signals: Signals, state: PolicyState, now: float) -> bool:
    """The last second's load is over ``SURGE`` x the current replicas' capacity."""
    last = max_load(signals, now, 1.0, recent_service_s(config, signals, now))
    return last is not None and last > SURGE * state.replicas * state.target


def _projected(config: ScalingConfig, signals: Signals, service_s: Optional[float]) -> Optional[float]:
    """A surge still rising: the load its last second's rise reaches within one decision interval (the
    replicas asked for now serve only after their start), else None."""
    ramp = rising(signals, service_s)
    return None if ramp is None else ramp[0] + ramp[1] * config.decision_interval_s


def _stream_drain(config: ScalingConfig, signals: Signals, now: float) -> Optional[int]:
    """The replicas that serve the current throughput plus a stream's backlog within its ``max_lag_s``
    (``Sample.stream_backlog_per_s``, its largest over the scale-up window), at the throughput a replica
    reached over that window; None without a backlog, without a measured throughput, or when draining it
    needs at most ``BACKLOG_SLACK`` more throughput (the replicas' slack drains that)."""
    recent = signals.since(now - config.scale_up_window_s)
    last = signals.last
    backlog = max((s.stream_backlog_per_s for s in recent), default=0.0)
    if last is None or backlog <= 0 or last.ready_replicas <= 0:
        return None
    served_per_s = sum(s.completed for s in recent) / max(1, len(recent))
    if served_per_s <= 0 or backlog <= BACKLOG_SLACK * served_per_s:
        return None
    per_replica = served_per_s / last.ready_replicas
    return math.ceil((served_per_s + backlog) / per_replica - 1e-9)


def _held_at_cores(signals: Signals, now: float, current: int, desired: int) -> Optional[tuple[int, float]]:
    """For replicas sharing one machine: the most replicas worth having, ``max(current, cores)`` while the
    cores were at least ``CORES_BUSY`` busy over the last ``HOLD_WINDOW_S`` (else ``desired``), with that busy
    share; None when the samples say nothing of a machine. The last second, not the decision interval: a surge
    is decided within a second of a step, when the interval's mean still holds the quiet seconds before it.
    A busy second that passes holds growth back for one decision only.
    It only stops growth: replicas over the cores leave by the ordinary scale-down."""
    recent = [s for s in signals.since(now - HOLD_WINDOW_S) if s.cores > 0 and s.cores_busy is not None]
    if not recent:
        return None
    busy = sum(s.cores_busy or 0.0 for s in recent) / len(recent)
    cap = max(current, recent[-1].cores)
    return (min(desired, cap) if busy >= CORES_BUSY else desired), round(busy, 3)


def _horizontal(config: ScalingConfig, signals: Signals, state: PolicyState, now: float,
                surge: bool = False) -> tuple[int, str, dict]:
    target, current = state.target, state.replicas
    floor = floor_replicas(config, target)
    service_s = recent_service_s(config, signals, now)
    load_up = max_load(signals, now, config.scale_up_window_s, service_s) or 0.0
    projected = _projected(config, signals, service_s) if surge else None
    if projected is not None:
        load_up = max(load_up, projected)
    load_down = max_load(signals, now, config.scale_down_window_s, service_s) or 0.0
    inputs = {"load_up": load_up, "load_down": load_down, "target": target, "current": current,
              "service_s": service_s, "surge": surge, "projected": projected}
    idle_for = now - (state.last_busy if state.last_busy is not None else now)
    if config.scale_to_zero and floor == 0 and load_down == 0 and idle_for >= config.idle_window_s:
        return 0, "idle: scale to zero", inputs
    want_up = math.ceil(load_up / target - 1e-9)
    desired, reason = current, "within tolerance"
    if current == 0:
        if load_up > 0:
            desired, reason = max(1, want_up), "activation"
    elif load_up > current * target * (1 + config.up_tolerance):
        desired, reason = want_up, "scale up"
    elif load_down < current * target * (1 - config.tolerance):
        desired, reason = math.ceil(load_down / target - 1e-9), "scale down"
    drain = _stream_drain(config, signals, now)
    if drain is not None and drain > desired:  # a backlog holds its replicas against a scale-down too
        desired, reason = drain, "stream lag"
    inputs["stream_drain"] = drain
    held = _held_at_cores(signals, now, current, desired)
    if held is not None:
        inputs["cores_busy"] = held[1]
        if held[0] < desired:
            desired, reason = held[0], reason + f" (held at {held[0]}: the machine's cores are busy)"
    bounded = min(config.max_replicas, max(floor, desired))
    if bounded != desired:
        reason += f" (bounded to [{floor}, {config.max_replicas}])"
    if bounded == 0 and current > 0:
        # zero only through the idle rule above: a scale-down window shorter than the idle window
        # must not take the last replica early
        bounded, reason = 1, reason + " (the last replica leaves after the idle window)"
    return bounded, reason, inputs
