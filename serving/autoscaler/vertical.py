"""The vertical axis: re-tunes an entity's per-replica target concurrency (pure functions).

Every ``vertical_interval_s`` the target moves towards the in-flight count at which replicas run at the
utilisation aim (``by_utilisation``). Under latency or queue stress it is cut at once (by up to
``max_step_down``); the target that caused stress becomes a ceiling that lifts ``CEILING_LIFT`` a calm
cycle; when calm it rises by at most ``max_step_up``.
Each metric has its own hysteresis marks.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.signals import Sample, Signals

if TYPE_CHECKING:
    from serving.autoscaler.policy import PolicyState

LATENCY_GOAL = 0.8  # aim p99 at this share of the SLO
LATENCY_HIGH, LATENCY_LOW = 0.9, 0.7  # hysteresis marks, as shares of the SLO
QUEUE_HIGH, QUEUE_LOW = 0.5, 0.25  # queued share of in-flight requests
UTIL_HIGH, UTIL_LOW = 0.95, 0.85  # busy share of parallel capacity
QUEUE_CONTENTION = 0.1  # a queued share above this is contention
MIN_CHANGE = 0.1  # a vertical change smaller than this share is not made
CEILING_LIFT = 0.05  # slow increase: a ceiling lifts this share a calm cycle
ACTIVE_SHARE = 0.5  # a cycle with traffic in fewer of its seconds than this share holds the target
SETTLED_SHARE = 1 / 3  # stress is judged on the settled seconds when they are at least this share
MEASURABLE_UTIL = 0.01  # below this busy share, in-flight over utilisation (the slots) is noise


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _weighted_p99(samples: list[Sample]) -> float | None:
    """The seconds' p99, weighted by their requests (None without a latency)."""
    weighted = [(s.latency_p99_ms, max(1, s.requests)) for s in samples if s.latency_p99_ms is not None]
    return sum(v * w for v, w in weighted) / sum(w for _, w in weighted) if weighted else None


def _utilisation_aim(config: ScalingConfig, p99: float | None, queued_share: float, slots: float) -> float:
    """The busy share of a replica's ``slots`` to aim at: ``target_utilisation``, raised with the latency
    slack while nothing queues (p99 far inside the goal tolerates fewer spare slots), at most
    ``1 - 1 / sqrt(slots)`` (a replica's in-flight count varies by about its square root) and ``UTIL_HIGH``."""
    aim = config.target_utilisation
    if p99 is not None and p99 > 0 and queued_share <= QUEUE_CONTENTION and slots > 1:
        noise = 1.0 - 1.0 / math.sqrt(slots)
        aim = max(aim, min(UTIL_HIGH, noise, aim * LATENCY_GOAL * config.latency_slo_ms / p99))
    return aim


def _latency_cut(target: float, p99: float, goal: float, util: float | None) -> float:
    """The target that brings p99 to ``goal``: in proportion (``target x goal / p99``), or, near
    saturation, the smaller cut queueing asks for -- waiting grows as ``1 / (1 - u)``, so the
    utilisation that puts p99 at the goal is ``1 - (1 - u) x p99 / goal``."""
    cut = target * goal / p99
    if util is not None and 0 < util < 1:
        u_goal = 1 - (1 - util) * p99 / goal
        if u_goal > 0:
            cut = max(cut, target * u_goal / util)
    return cut


def _stress_samples(active: list[Sample], window: tuple[Sample, ...]) -> list[Sample]:
    """The seconds stress is judged on: those in which every replica asked for was ready (a second with
    replicas still starting shows the capacity that is coming), or all when too few."""
    settled = [s for s in active if s.ready_replicas >= s.replicas]
    return settled if len(settled) >= max(1, len(window) * SETTLED_SHARE) else active


def _contention(config: ScalingConfig, queued_share: float, util: float | None) -> bool:
    """Latency stress lowers the target only when it comes from contention (a queue, or busy replicas):
    a model whose own service time is slow does not get faster with fewer requests per replica."""
    return queued_share > QUEUE_CONTENTION or util is None or util > config.target_utilisation


def _by_utilisation(config: ScalingConfig, busy: float, util: float, p99: float | None, queued_share: float) -> float:
    """The target at which the replicas run at the utilisation aim; what latency slack adds to the plain
    aim stops at the measured capacity (``slots``)."""
    slots = busy / util  # a replica's parallel capacity, measured
    aim = _utilisation_aim(config, p99, queued_share, slots)
    if aim > config.target_utilisation:
        return max(slots * config.target_utilisation, min(slots * aim, slots))
    return slots * aim


def retune(config: ScalingConfig, signals: Signals, state: PolicyState, now: float) -> tuple[PolicyState, dict]:
    """One vertical cycle at ``now``: the new target (and stress marks, ceiling) in the state, and why."""
    window = signals.since(now - config.vertical_interval_s)
    active = [s for s in window if s.ready_replicas > 0 and s.in_flight > 0]
    state = replace(state, last_vertical=now)
    if len(active) < max(1, len(window) * ACTIVE_SHARE):
        return state, {"vertical": "hold: not enough traffic"}
    metrics, slo = set(config.vertical_metrics), config.latency_slo_ms
    per_replica = _mean([s.in_flight / s.ready_replicas for s in active]) or 0.0
    queued_share = _mean([s.queue_depth / s.in_flight for s in active]) or 0.0
    p99 = _weighted_p99(active)
    p99_stress = _weighted_p99(_stress_samples(active, window))
    p99_stress = p99 if p99_stress is None else p99_stress
    util = _mean([s.utilisation for s in active if s.utilisation is not None])
    lat = p99 if "latency" in metrics else None  # the readings of the metrics in use (None: not used)
    used_util = util if "utilisation" in metrics else None
    # per-metric hysteresis: enter above the high mark, leave below the low one
    lat_stressed = (
        lat is not None
        and p99_stress is not None
        and p99_stress > slo * (LATENCY_LOW if state.latency_stressed else LATENCY_HIGH)
    )
    queue_stressed = "queue" in metrics and queued_share > (QUEUE_LOW if state.queue_stressed else QUEUE_HIGH)
    util_high = used_util is not None and used_util > (UTIL_LOW if state.utilisation_high else UTIL_HIGH)
    state = replace(state, latency_stressed=lat_stressed, queue_stressed=queue_stressed, utilisation_high=util_high)
    busy = _mean([(s.in_flight - s.queue_depth) / s.ready_replicas for s in active]) or 0.0  # in service a replica
    by_util = (
        _by_utilisation(config, busy, used_util, lat, queued_share)
        if used_util is not None and used_util > MEASURABLE_UTIL and busy > 0
        else None
    )
    by_latency = per_replica * LATENCY_GOAL * slo / lat if lat is not None and lat > 0 else None
    inputs: dict[str, Any] = {
        "per_replica_in_flight": per_replica,
        "queued_share": queued_share,
        "p99_ms": p99,
        "p99_settled_ms": p99_stress,
        "utilisation": util,
        "latency_stressed": lat_stressed,
        "queue_stressed": queue_stressed,
        "utilisation_high": util_high,
        "by_utilisation": by_util,
        "by_latency": by_latency,
        "target_before": state.target,
    }
    new, ceiling, how = _step(config, state, lat, p99_stress, used_util, queued_share, by_util, by_latency, busy)
    inputs["vertical"] = how
    new = min(config.max_target, max(config.min_target, new))
    return replace(state, target=new, ceiling=ceiling), inputs


def _step(
    config: ScalingConfig,
    state: PolicyState,
    p99: float | None,
    p99_stress: float | None,
    util: float | None,
    queued_share: float,
    by_util: float | None,
    by_latency: float | None,
    busy: float = 0.0,
) -> tuple[float, float | None, str]:
    """The new target, the ceiling and why, from the cycle's readings (``p99``/``util`` None: not used)."""
    target, ceiling = state.target, state.ceiling
    goal = LATENCY_GOAL * config.latency_slo_ms
    lat_calm = p99 is None or p99 < config.latency_slo_ms * LATENCY_LOW
    queue_cut = state.queue_stressed and not lat_calm
    if (state.latency_stressed and _contention(config, queued_share, util)) or queue_cut:
        # down by the latency excess (relative to the target), at least MIN_CHANGE, at most max_step_down
        by_excess = (
            _latency_cut(target, p99_stress, goal, util)
            if p99 is not None and p99_stress is not None and p99_stress > 0
            else None
        )
        ceiling = target  # it proved too high: increases probe back towards it slowly
        if by_excess is not None and by_excess >= target * (1 - MIN_CHANGE) and not queue_cut:
            return target, ceiling, "hold: stressed, change too small"
        proposal = min(x for x in (by_excess, by_util, target * (1 - MIN_CHANGE)) if x is not None)
        return max(target * config.max_step_down, proposal), ceiling, "decrease: stressed"
    if by_util is not None and by_util < target * (1 - MIN_CHANGE):
        return max(target * config.max_step_down, by_util), ceiling, "decrease: over the utilisation target"
    if lat_calm and not state.queue_stressed:
        proposal = by_util if by_util is not None else (by_latency or target)
        if ceiling is not None:
            ceiling *= 1 + CEILING_LIFT
            proposal = min(proposal, ceiling * (1 - MIN_CHANGE))
        new = min(proposal, target * config.max_step_up)
        if new < target * (1 + MIN_CHANGE):
            return target, ceiling, "hold: calm, change too small"
        return new, ceiling, "increase: calm"
    return target, ceiling, "hold: between marks"
