"""The two-axis policy: pure ``decide(config, signals, state, now) -> (decision, state)``.

No clock reads, no I/O, no randomness: the caller passes ``now`` and the signals (one sample a second)
and keeps the returned state.

The horizontal model. A second's load is the concurrency its arrivals need: arrivals x the measured
service time (Little's law), or the requests in service when more (``load.py``). A replica asked for now
serves only ``Sample.ready_in_s`` later (a standby's activation, a cold start, a pod), so the policy sizes
for the larger of the scale-up window's peak load and the load forecast at that lead time (the last
second's load plus the trend of the last ``FORECAST_S`` seconds, a median of pairwise slopes that a step
does not move, counted when the seconds rise more consistently than noise, times the lead time), and a
queue that stood through those seconds with nothing starting (clients in a closed loop) served within the
latency goal; an entity fed by a stream adds its backlog's arrivals (``Sample.stream_backlog_per_s``) times
the service time. Replicas = ``ceil(need / target)``, the target being the per-replica concurrency the
vertical axis learns (at most what a replica predicts at once, ``PolicyState.serves``, when that was
measured). Up at any second the need is over the replicas' capacity; down only at a ``decision_interval_s``
boundary, sized on the scale-down window's peak and only when it is ``tolerance`` under capacity. The last
replica leaves only through the idle window; replicas that share one machine (``Sample.cores``) do not grow
past its cores while they are busy.

The vertical axis (every ``vertical_interval_s``, ``vertical.py``) sets the target. The gateway's
admission limit is ``target x admission_headroom`` and, with ``shed_load``, its queue holds what the
measured throughput answers within the latency goal (``load.queue_bound``).

The ablation rows of the rules, and which rules have none and why, are in docs/benchmarks/autoscaler.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.load import forecast, max_load, queue_bound, recent_service_s
from serving.autoscaler.signals import Signals
from serving.autoscaler.vertical import LATENCY_GOAL, retune

FORECAST_S = 5  # the trend of the load, and a standing queue, are read over this many last seconds
CORES_BUSY = 0.9  # a machine whose cores were this busy over its last HOLD_WINDOW_S has none to spare
HOLD_WINDOW_S = 1.0  # the machine's busy share is read over its last second: a scale-up is decided at any second

_DEFAULT_TARGET = ScalingConfig().initial_target


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between calls."""

    replicas: int
    target: float
    started_at: float | None = None
    last_horizontal: float | None = None
    last_vertical: float | None = None
    last_busy: float | None = None  # last time a request arrived or was in flight
    latency_stressed: bool = False
    queue_stressed: bool = False
    utilisation_high: bool = False
    ceiling: float | None = None  # a target that caused stress: increases stay below it
    serves: float | None = None  # what one replica predicts at once, as measured (None: unknown)

    @classmethod
    def initial(cls, config: ScalingConfig, replicas: int | None = None, serves: float | None = None) -> PolicyState:
        start = config.min_replicas if replicas is None else replicas
        return cls(replicas=start, target=config.initial_target, serves=serves)


@dataclass(frozen=True)
class Decision:
    """The replica count and per-replica concurrency to apply, and why."""

    replicas: int
    target_concurrency: float
    max_concurrency: int  # per-replica admission limit for the gateway
    queue_limit: int  # gateway queue bound: what can wait without missing the SLO
    horizontal: bool  # a horizontal decision was taken in this call
    vertical: bool  # a vertical decision was taken in this call
    reason: str
    inputs: Mapping[str, Any] = field(default_factory=dict)


def max_concurrency_for(config: ScalingConfig, target: float) -> int:
    """The admission limit the gateway enforces for a target: ``ceil(target x admission_headroom)``."""
    return max(1, math.ceil(target * config.admission_headroom - 1e-9))


def floor_replicas(config: ScalingConfig, target: float) -> int:
    """The provisioned minimum: ``min_replicas``, and enough replicas for ``provisioned_concurrency``."""
    return min(config.max_replicas, max(config.min_replicas, math.ceil(config.provisioned_concurrency / target - 1e-9)))


def seeded(config: ScalingConfig, replica_serves: int) -> ScalingConfig:
    """The config with its starting per-replica target set to what one replica predicts at once
    (``replica_serves``: a batched model's batch size; 1 for a model predicted a request at a time; times
    the workers that predict side by side): the target is a concurrency in service, the count the
    horizontal axis divides the load by. Only with the vertical axis on and the default target: a target
    the user set, or one fixed with the vertical axis off, stays. The gateway and the simulator both
    start from it."""
    if not config.vertical or config.initial_target != _DEFAULT_TARGET:
        return config
    return replace(config, initial_target=min(config.max_target, max(config.min_target, float(replica_serves))))


def decide(config: ScalingConfig, signals: Signals, state: PolicyState, now: float) -> tuple[Decision, PolicyState]:
    """One policy step at ``now``. Pure: same inputs, same outputs."""
    last = signals.last
    if state.started_at is None:
        state = replace(state, started_at=now, last_busy=now)
    if last is not None and (last.requests > 0 or last.in_flight > 0):  # busy now
        state = replace(state, last_busy=max(last.t, state.last_busy or last.t))
    inputs: dict[str, Any] = {}
    vertical = config.vertical and _due(state.last_vertical, state.started_at, config.vertical_interval_s, now)
    if vertical:
        state, vinputs = retune(config, signals, state, now)
        inputs.update(vinputs)
    due = _due(state.last_horizontal, state.started_at, config.decision_interval_s, now)
    desired, reason, hinputs = _horizontal(config, signals, state, now, due)
    horizontal = due or desired != state.replicas  # a boundary, or a scale-up (an activation) between them
    if horizontal:
        inputs.update(hinputs)
        state = replace(state, replicas=desired, last_horizontal=now if due else state.last_horizontal)
    else:
        reason = "hold"
    decision = Decision(
        replicas=state.replicas,
        target_concurrency=state.target,
        max_concurrency=max_concurrency_for(config, state.target),
        queue_limit=queue_bound(config, signals, now, LATENCY_GOAL),
        horizontal=horizontal,
        vertical=vertical,
        reason=reason,
        inputs=inputs,
    )
    return decision, state


def _due(last: float | None, started: float | None, interval: float, now: float) -> bool:
    """An axis acts once ``interval`` has passed since it last acted (or since the policy started)."""
    ref = last if last is not None else started
    return ref is not None and now - ref >= interval - 1e-9


def _standing_queue(config: ScalingConfig, signals: Signals, service_s: float | None) -> float:
    """The concurrency that serves, within the latency goal, a queue that stood through each of the last
    ``FORECAST_S`` seconds (its smallest) with nothing starting and not draining: the demand of clients that
    wait for their answer before they send again (a closed loop), whose arrivals never exceed the throughput.
    First in, first out, the last of ``Q`` waiting is served after ``Q x service time / replicas``. A queue
    that replicas being started will serve, or that drains, adds nothing: it is gone before more could start."""
    recent = signals.samples[-FORECAST_S:]
    if service_s is None or len(recent) < FORECAST_S or recent[-1].queue_depth < recent[0].queue_depth:
        return 0.0
    if any(s.ready_replicas < s.replicas for s in recent):
        return 0.0
    return min(s.queue_depth for s in recent) * service_s / (LATENCY_GOAL * config.latency_slo_ms / 1000.0)


def _held_at_cores(signals: Signals, now: float, current: int, desired: int) -> tuple[int, float] | None:
    """For replicas sharing one machine: the most replicas worth having, ``max(current, cores)`` while the
    cores were at least ``CORES_BUSY`` busy over the last ``HOLD_WINDOW_S`` (else ``desired``), with that busy
    share; None when the samples say nothing of a machine. The last second, not the decision interval: a scale-up
    is decided within a second of a step, when the interval's mean still holds the quiet seconds before it.
    A busy second that passes holds growth back for one decision only.
    It only stops growth: replicas over the cores leave by the ordinary scale-down."""
    recent = [s for s in signals.since(now - HOLD_WINDOW_S) if s.cores > 0 and s.cores_busy is not None]
    if not recent:
        return None
    busy = sum(s.cores_busy or 0.0 for s in recent) / len(recent)
    cap = max(current, recent[-1].cores)
    return (min(desired, cap) if busy >= CORES_BUSY else desired), round(busy, 3)


def _horizontal(
    config: ScalingConfig, signals: Signals, state: PolicyState, now: float, due: bool
) -> tuple[int, str, dict]:
    """The replica count the model asks for at ``now`` (scale-down only when ``due``), why, and its inputs."""
    target, current, last = state.target, state.replicas, signals.last
    floor = floor_replicas(config, target)
    # a replica serves at most what it predicts at once, whatever its target (a fixed max_concurrency, say)
    per_replica = min(target, state.serves) if state.serves else target
    service_s = recent_service_s(config, signals, now)
    lead_s = last.ready_in_s if last is not None else 0.0
    peak = max_load(signals, now, config.scale_up_window_s, service_s) or 0.0
    ahead = forecast(signals.samples[-FORECAST_S:], service_s, lead_s)
    recent = signals.since(now - config.scale_up_window_s)
    backlog = max((s.stream_backlog_per_s for s in recent), default=0.0) * (service_s or 0.0)
    standing = _standing_queue(config, signals, service_s)
    need_up = max(peak, ahead if ahead is not None else 0.0, standing) + backlog
    inputs: dict[str, Any] = {
        "load_up": need_up,
        "peak": peak,
        "forecast": ahead,
        "lead_s": lead_s,
        "standing_queue": standing,
        "stream_backlog": backlog,
        "target": target,
        "per_replica": per_replica,
        "current": current,
        "service_s": service_s,
        "boundary": due,
    }
    desired, reason = current, "within tolerance"
    if current == 0:
        if need_up > 0:
            desired, reason = max(1, math.ceil(need_up / per_replica - 1e-9)), "activation"
    elif need_up > current * per_replica:
        desired, reason = math.ceil(need_up / per_replica - 1e-9), "scale up"
    elif due:
        need_down = max(max_load(signals, now, config.scale_down_window_s, service_s) or 0.0, standing) + backlog
        inputs["load_down"] = need_down
        idle_for = now - (state.last_busy if state.last_busy is not None else now)
        if config.scale_to_zero and floor == 0 and need_down == 0 and idle_for >= config.idle_window_s:
            return 0, "idle: scale to zero", inputs
        if need_down < current * per_replica * (1 - config.tolerance):
            desired, reason = math.ceil(need_down / per_replica - 1e-9), "scale down"
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
