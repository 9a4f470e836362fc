"""The two-axis policy: pure functions ``(config, signals, state, now) -> (decision, state)``.

No clock reads, no I/O, no randomness: the caller passes ``now`` and the signals, and keeps the
returned state for the next call. The controller calls :func:`decide` once per sample (every second);
each axis acts only when its interval has passed.

Horizontal (every ``decision_interval_s``): ``desired = ceil(concurrency / target)`` with the
concurrency taken as the max of the 1-s samples over the last ``scale_up_window_s`` when scaling up,
and over the last ``scale_down_window_s`` when scaling down (so replicas leave only after the load has
stayed low for the whole window). A second's concurrency is the requests in service, or, when more,
the requests that arrived within the last service time (Little's law over one service time: a burst
shorter than a slow model's service time never has rate x service time requests in flight). A tolerance band under the current capacity (``tolerance``; and
``up_tolerance`` over it) suppresses flapping, and
one cycle adds at most ``max(current + min_growth_replicas, ceil(max_growth x demand / target))``,
where demand is the concurrency the current arrival rate needs (Little's law: arrivals/s x the
measured service time, plus what drains the backlog in ``DRAIN_S``): in-flight counts inflated by a
queue that built up while replicas were starting do not buy a flood of replicas. A surge (the last
second's load above ``SURGE`` x the current replicas' target concurrency, Knative's panic threshold)
is decided at once instead of at the next 5-s boundary, and while a scale-up is under way any load
over capacity is too. A surge is judged with the last second's service time when it is longer than the
interval's (a surge slows a batching or saturated model at once), and a surge decision between
boundaries sizes for the load the last second's rise reaches within one decision interval (the
replicas asked for now serve only after their start; the growth cap still bounds one decision).

Vertical (every ``vertical_interval_s``): re-tunes the per-replica target concurrency, which is the
horizontal denominator. The aim is the target at which replicas run ``target_utilisation`` busy: the
in-flight count that keeps a replica that busy (busy requests / utilisation x target_utilisation; the
utilisation signal measures the replica's parallel capacity, whatever the model), times the measured
ratio of the target to the mean in-flight count (the horizontal sizes replicas for the peak of its
window, so they run below the target on average; the ratio is bounded by ``HEADROOM_MAX`` and not
applied at the replica floor or while the scale-down window holds more replicas than ``HEADROOM_MAX``
times the recent peak needs: there the count does not follow the target). While nothing queues and
p99 is well inside the goal, the utilisation aim rises with that latency slack, at most to
``1 - 1/sqrt(slots)`` (one standard deviation of a replica's in-flight count kept spare) and never
past the measured capacity (see ``_utilisation_aim``). Each metric has its own hysteresis (it enters "stressed"
above a high mark and leaves below a lower one). Latency stress is judged on the seconds in which
every replica asked for was ready (a second with replicas still starting shows the capacity that is
coming, not the target; with too few such seconds, on all), calm on all seconds. Under latency or
queue stress the target drops at once, by up to ``max_step_down`` per cycle, in proportion to the
latency excess over ``LATENCY_GOAL`` of the SLO -- or, near saturation, by the smaller cut that
queueing asks for (waiting grows as ``1 / (1 - u)``, see ``_latency_cut``) -- and the target that
caused it becomes a ceiling that lifts only 5 % per calm cycle (slow increase). When calm, the target
moves to the utilisation aim, by at most ``max_step_up`` per cycle. A cycle with too little traffic, or whose
last second is idle (the load stopped: a target raised then would take replicas before the scale-down
window is over), holds. Changes under ``MIN_CHANGE`` are
not made, either way (a latency-stress cut that small holds the target and marks it as the ceiling),
which keeps the target steady under constant load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.signals import Sample, Signals

LATENCY_GOAL = 0.8            # aim p99 at this share of the SLO
LATENCY_HIGH, LATENCY_LOW = 0.9, 0.7    # hysteresis marks, as shares of the SLO
QUEUE_HIGH, QUEUE_LOW = 0.5, 0.25       # queued share of in-flight requests
UTIL_HIGH, UTIL_LOW = 0.95, 0.85        # busy share of parallel capacity
QUEUE_CONTENTION = 0.1        # a queued share above this is contention
MIN_CHANGE = 0.1              # a vertical change smaller than this share is not made
SURGE = 1.5                   # a 1-s load above this many times capacity is decided at once
DRAIN_S = 10.0                # a backlog should be worked off in about this long
HEADROOM_MAX = 1.5            # the vertical aim allows at most this target / mean in-flight ratio
CEILING_LIFT = 0.05           # slow increase: a ceiling lifts this share a calm cycle


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
    surging: bool = False                 # the last horizontal decision was a scale-up

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
    if last is not None and (last.requests > 0 or last.in_flight > 0):
        state = replace(state, last_busy=max(last.t, state.last_busy or last.t))
    inputs: dict[str, Any] = {}
    vertical = False
    if config.vertical and _due(state.last_vertical, state.started_at, config.vertical_interval_s, now):
        state, vinputs = _vertical(config, signals, state, now)
        inputs.update(vinputs)
        vertical = True
    horizontal = False
    reason = "hold"
    activation = state.replicas == 0 and last is not None and (last.requests > 0 or last.in_flight > 0)
    # a surge (and, once in one, any load over capacity) is decided at once, not at the next boundary
    surge = (last is not None and state.replicas > 0
             and _last_load(config, signals, now) > _surge_over(config, state) * state.replicas * state.target)
    due = _due(state.last_horizontal, state.started_at, config.decision_interval_s, now)
    if activation or surge or due:
        # between boundaries a surge is decided from the last second (see _horizontal); on a boundary the
        # regular decision from the windows stands
        desired, reason, hinputs = _horizontal(config, signals, state, now, surge=surge and not due)
        inputs.update(hinputs)
        state = replace(state, replicas=desired, last_horizontal=now, surging=desired > state.replicas)
        horizontal = True
    decision = Decision(
        replicas=state.replicas, target_concurrency=state.target,
        max_concurrency=max_concurrency_for(config, state.target),
        queue_limit=queue_bound(config, signals, now),
        horizontal=horizontal, vertical=vertical, reason=reason, inputs=inputs,
    )
    return decision, state


def queue_bound(config: ScalingConfig, signals: Signals, now: float) -> int:
    """How many requests may wait at the gateway: what the measured throughput serves within the
    latency goal (``throughput x (goal - service time)``), so a request admitted is one that can still
    meet the SLO and the rest get a fast 429 instead of a slow answer. ``max_queue`` while nothing has
    been served in the last interval (scale from zero: requests are held, not dropped)."""
    recent = signals.since(now - config.decision_interval_s)
    if not recent:
        return config.max_queue
    n = len(recent)
    throughput = sum(s.completed for s in recent) / n
    if throughput <= 0 or recent[-1].ready_replicas == 0:
        return config.max_queue
    busy = sum(max(0.0, s.in_flight - s.queue_depth) for s in recent) / n
    service_s = busy / throughput
    wait_s = LATENCY_GOAL * config.latency_slo_ms / 1000.0 - service_s
    return int(min(config.max_queue, max(1, math.ceil(throughput * max(0.0, wait_s)))))


def _surge_over(config: ScalingConfig, state: PolicyState) -> float:
    """A 1-s load over this many times capacity is decided at once: ``SURGE``, and once a scale-up is
    under way, any load over capacity (with ``up_tolerance``)."""
    return 1 + config.up_tolerance if state.surging else SURGE


def _due(last: Optional[float], started: Optional[float], interval: float, now: float) -> bool:
    """An axis acts once ``interval`` has passed since it last acted (or since the policy started)."""
    ref = last if last is not None else started
    return ref is not None and now - ref >= interval - 1e-9


def _service_s(samples: tuple[Sample, ...]) -> Optional[float]:
    """Mean service time, measured as busy requests over completions (Little's law on service)."""
    completed = sum(s.completed for s in samples)
    if completed <= 0:
        return None
    busy = sum(max(0.0, s.in_flight - s.queue_depth) for s in samples)
    return busy / completed


def _recent_service_s(config: ScalingConfig, signals: Signals, now: float, surge: bool = False) -> Optional[float]:
    """The service time over the last decision interval (it moves with batch sizes), else the last 20 s.

    With ``surge``, the last second's when it is longer: a surge makes a saturating or batching model
    slower at once (bigger batches, a replica past its parallelism), and the interval's mean still
    holds the seconds before it, so demand taken from it would lag the surge by the interval."""
    base = (_service_s(signals.since(now - config.decision_interval_s))
            or _service_s(signals.since(now - config.scale_up_window_s)))
    return _surge_service_s(signals, now, base) if surge and base is not None else base


def _surge_service_s(signals: Signals, now: float, base: float) -> float:
    """In a surge, the last second's service time when it is longer than ``base``."""
    last = _service_s(signals.since(now - 1.0))
    return base if last is None else max(base, last)


def _load(s: Sample, service_s: Optional[float], arrivals: Optional[float] = None) -> float:
    """A second's concurrency: the requests in service, or what its arrivals need when more --
    requests turned away with a 429 still count as demand -- plus the share of the queue that drains
    it in ``DRAIN_S``. What arrivals need is Little's law over one service time: the requests that
    arrived in the last ``service_s`` seconds (``arrivals``, see :func:`_loads`; without it, this
    second's rate x the service time). Without a measured service time: the in-flight count."""
    if service_s is None:
        return s.in_flight
    busy = max(0.0, s.in_flight - s.queue_depth)
    needed = s.requests * service_s if arrivals is None else arrivals
    return max(busy, needed) + s.queue_depth * service_s / DRAIN_S


def _loads(samples: tuple[Sample, ...], service_s: Optional[float]) -> list[float]:
    """``_load`` of each sample, its arrivals term counted over the last service time.

    The in-flight count a stream of arrivals keeps up is what arrived during one service time (Little's
    law), not one second's rate times the service time: for a model slower than the 1-s sample, a
    burst shorter than its service time never has rate x service time requests in flight, and a rate
    that holds shows in the seconds that follow. So each second's arrivals term sums the samples of the
    last ``service_s`` seconds (the oldest one in part); a model faster than a second keeps this
    second's rate x the service time.
    """
    if service_s is None or service_s <= 1.0:
        return [_load(s, service_s) for s in samples]
    whole = int(service_s)
    part = service_s - whole
    out = []
    for i, s in enumerate(samples):
        window = samples[max(0, i - whole + 1): i + 1]
        arrivals = float(sum(x.requests for x in window))
        if i - whole >= 0:
            arrivals += part * samples[i - whole].requests
        else:  # history shorter than the service time: the oldest known rate stands in
            arrivals += (service_s - len(window)) * samples[0].requests
        out.append(_load(s, service_s, arrivals))
    return out


def _max_load(signals: Signals, now: float, window_s: float, service_s: Optional[float]) -> Optional[float]:
    """The largest ``_loads`` value of the samples of the last ``window_s`` (None without samples)."""
    since = now - window_s
    values = [v for s, v in zip(signals.samples, _loads(signals.samples, service_s)) if s.t > since]
    return max(values) if values else None


def _last_load(config: ScalingConfig, signals: Signals, now: float) -> float:
    """``_loads`` of the last sample (its arrivals over the last service time, taken as in a surge)."""
    service_s = _recent_service_s(config, signals, now, surge=True)
    recent = signals.since(now - max(1.0, math.ceil(service_s or 0.0)) - 1.0)
    return _loads(recent, service_s)[-1] if recent else 0.0


def _demand(samples: tuple[Sample, ...], service_s: Optional[float]) -> float:
    """In-flight requests the arrival rate needs: ``rate x service time + backlog x service time / DRAIN_S``.

    Without a service time measured yet, the mean in-flight count stands in.
    """
    if not samples:
        return 0.0
    n = len(samples)
    in_flight = sum(s.in_flight for s in samples) / n
    if service_s is None:
        return in_flight
    queued = sum(s.queue_depth for s in samples) / n
    rate = sum(s.requests for s in samples) / n
    return rate * service_s + queued * service_s / DRAIN_S


def _rising(signals: Signals, now: float, service_s: Optional[float]) -> Optional[tuple[float, float]]:
    """The last second's ``_loads`` and how much the load rises a second, when the arrival rate rose in
    each of the last two seconds (a ramp still going: a step rises once and stops), else None. The rise
    is the smaller of the two rate increases times the service time (Little's law)."""
    if service_s is None:
        return None
    recent = signals.since(now - max(1.0, math.ceil(service_s)) - 3.0)
    if len(recent) < 3:
        return None
    a, b, c = (x.requests for x in recent[-3:])
    if not c > b > a:
        return None
    return _loads(recent, service_s)[-1], min(c - b, b - a) * service_s


def _horizontal(config: ScalingConfig, signals: Signals, state: PolicyState, now: float,
                surge: bool = False) -> tuple[int, str, dict]:
    target = state.target
    current = state.replicas
    floor = floor_replicas(config, target)
    service_s = _recent_service_s(config, signals, now, surge=surge)
    load_up = _max_load(signals, now, config.scale_up_window_s, service_s) or 0.0
    projected = None
    if surge:
        # a surge still rising: size for where it is heading over the next decision interval (its last
        # second's rise continued), not for where it was -- the replicas asked for now are ready only
        # after their start; the growth cap below still bounds what one decision adds
        rising = _rising(signals, now, service_s)
        if rising is not None:
            last_load, rise = rising
            projected = last_load + rise * config.decision_interval_s
            load_up = max(load_up, projected)
    load_down = _max_load(signals, now, config.scale_down_window_s, service_s) or 0.0
    # demand now: over the decision interval, or over the last second when that is higher (a surge)
    load_now = max(_demand(signals.since(now - config.decision_interval_s), service_s),
                   _demand(signals.since(now - 1.0), service_s))
    inputs = {"load_up": load_up, "load_down": load_down, "load_now": load_now, "target": target,
              "current": current, "service_s": service_s, "surge": surge, "projected": projected}
    idle_for = now - (state.last_busy if state.last_busy is not None else now)
    if (config.scale_to_zero and floor == 0 and load_down == 0 and idle_for >= config.idle_window_s):
        return 0, "idle: scale to zero", inputs
    want_up = math.ceil(load_up / target - 1e-9)
    want_down = math.ceil(load_down / target - 1e-9)
    desired, reason = current, "within tolerance"
    if current == 0:
        if load_up > 0:
            desired, reason = max(1, math.ceil(load_now / target - 1e-9), want_up), "activation"
    elif load_up > current * target * (1 + config.up_tolerance):
        desired = min(want_up, _growth_cap(config, current, load_now, target))
        reason = "scale up" if desired == want_up else "scale up (growth capped)"
    elif load_down < current * target * (1 - config.tolerance):
        desired, reason = want_down, "scale down"
    bounded = min(config.max_replicas, max(floor, desired))
    if bounded != desired:
        reason += f" (bounded to [{floor}, {config.max_replicas}])"
    if bounded == 0 and current > 0:
        # zero only through the idle rule above: a scale-down window shorter than the idle window
        # must not take the last replica early
        bounded, reason = 1, reason + " (the last replica leaves after the idle window)"
    return bounded, reason, inputs


def _growth_cap(config: ScalingConfig, current: int, load_now: float, target: float) -> float:
    """One cycle adds at most ``min_growth_replicas`` or what ``max_growth`` x the demand now needs."""
    return max(current + max(1, config.min_growth_replicas), math.ceil(config.max_growth * load_now / target - 1e-9))


def _mean(values: list[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def _utilisation_aim(config: ScalingConfig, p99: Optional[float], queued_share: float, slots: float) -> float:
    """The busy share of a replica's parallel capacity (``slots``) the vertical aims at.

    ``target_utilisation`` by default. While nothing queues (queued share at most
    ``QUEUE_CONTENTION``) and p99 is inside the latency goal, it rises with the latency slack, to
    ``target_utilisation x goal / p99``: the spare slots are kept so that bursts do not wait past the
    SLO, and a p99 that far inside the goal tolerates proportionally fewer of them. Bounded by
    ``1 - 1 / sqrt(slots)`` -- a replica's in-flight count varies by about its square root (Poisson),
    so one standard deviation of slots stays spare; a narrow replica (4 slots: 50 %) gets no slack --
    and by ``UTIL_HIGH``, the mark the vertical itself counts as high utilisation.
    """
    aim = config.target_utilisation
    if p99 is not None and p99 > 0 and queued_share <= QUEUE_CONTENTION and slots > 1:
        noise = 1.0 - 1.0 / math.sqrt(slots)
        aim = max(aim, min(UTIL_HIGH, noise, aim * LATENCY_GOAL * config.latency_slo_ms / p99))
    return aim


def _weighted_p99(samples: list[Sample]) -> Optional[float]:
    """The seconds' p99, weighted by their requests (None without a latency)."""
    weighted = [(s.latency_p99_ms, max(1, s.requests)) for s in samples if s.latency_p99_ms is not None]
    return sum(v * w for v, w in weighted) / sum(w for _, w in weighted) if weighted else None


def _latency_cut(target: float, p99: float, goal: float, util: Optional[float]) -> float:
    """The target that brings p99 to the goal: ``target x goal / p99`` (latency in proportion to the
    load, Little's law), or, when the replicas are busy enough that their latency is queueing, the
    smaller cut queueing asks for. Waiting grows as ``1 / (1 - u)`` with the utilisation ``u`` (M/M/1;
    a replica of many slots is flatter below saturation and steeper near it), so near saturation a
    little less load takes much latency off: the utilisation that puts p99 at the goal is
    ``1 - (1 - u) x p99 / goal``, and the target falls in that proportion. Far from saturation that
    formula would cut more than the proportional one, which stays the bound (how far latency there
    follows the load at all is the contention test's question)."""
    cut = target * goal / p99
    if util is not None and 0 < util < 1:
        u_goal = 1 - (1 - util) * p99 / goal
        if u_goal > 0:
            cut = max(cut, target * u_goal / util)
    return cut


def _ceiling_after_stress(target: float) -> Optional[float]:
    """The target that proved too high becomes a ceiling that increases probe back towards slowly."""
    return target


def _idle_now(window: tuple[Sample, ...]) -> bool:
    """The window ends idle: the load has stopped, which is no evidence either way, and a target raised
    now would take replicas before the scale-down window is over (it holds the load, not the target)."""
    return window[-1].requests == 0 and window[-1].in_flight == 0


def _stress_samples(active: list[Sample], window: tuple[Sample, ...]) -> list[Sample]:
    """The seconds stress is judged on: those in which every replica asked for was ready (a second with
    replicas still starting shows the capacity that is coming), or all when too few."""
    settled = [s for s in active if s.ready_replicas >= s.replicas]
    return settled if len(settled) >= max(1, len(window) // 3) else active


def _headroom(config: ScalingConfig, signals: Signals, state: PolicyState, now: float, per_replica: float) -> float:
    """The measured target / mean in-flight ratio, at most ``HEADROOM_MAX``: the horizontal sizes for the
    peak of its window, so replicas run below the target on average. 1 at the replica floor and while
    the scale-down window holds more than ``HEADROOM_MAX`` x what the recent peak needs."""
    target = state.target
    load_up = _max_load(signals, now, config.scale_up_window_s, _recent_service_s(config, signals, now)) or 0.0
    held = (state.replicas <= floor_replicas(config, target)
            or state.replicas > math.ceil(HEADROOM_MAX * load_up / target - 1e-9))
    return 1.0 if held else min(HEADROOM_MAX, max(1.0, target / per_replica))


def _contention(config: ScalingConfig, queued_share: float, util: Optional[float]) -> bool:
    """Latency stress lowers the target only when it comes from contention (a queue, or busy replicas):
    a model whose own service time is slow does not get faster with fewer requests per replica."""
    return queued_share > QUEUE_CONTENTION or util is None or util > config.target_utilisation


def _vertical(config: ScalingConfig, signals: Signals, state: PolicyState, now: float) -> tuple[PolicyState, dict]:
    window = signals.since(now - config.vertical_interval_s)
    active = [s for s in window if s.ready_replicas > 0 and s.in_flight > 0]
    state = replace(state, last_vertical=now)
    if len(active) < max(1, len(window) // 2):
        return state, {"vertical": "hold: not enough traffic"}
    if _idle_now(window):
        return state, {"vertical": "hold: idle now"}
    metrics = set(config.vertical_metrics)
    slo = config.latency_slo_ms
    per_replica = _mean([s.in_flight / s.ready_replicas for s in active]) or 0.0
    queued_share = _mean([s.queue_depth / s.in_flight for s in active]) or 0.0
    p99 = _weighted_p99(active)
    # stress (and the cut it makes) is judged on the seconds in which every replica asked for was ready:
    # a second with replicas still starting shows the capacity that is coming, not the target (the
    # horizontal has answered that latency already). Calm, which lets the target rise, is judged on
    # every second. With too few settled seconds (a long scale-up), every second counts for both.
    p99_stress = _weighted_p99(_stress_samples(active, window))
    if p99_stress is None:
        p99_stress = p99
    util = _mean([s.utilisation for s in active if s.utilisation is not None])
    lat_on = "latency" in metrics and p99 is not None
    queue_on = "queue" in metrics
    util_on = "utilisation" in metrics and util is not None
    # per-metric hysteresis: enter above the high mark, leave below the low one
    lat_stressed = lat_on and (p99_stress > slo * (LATENCY_LOW if state.latency_stressed else LATENCY_HIGH))
    queue_stressed = queue_on and (queued_share > (QUEUE_LOW if state.queue_stressed else QUEUE_HIGH))
    util_high = util_on and (util > (UTIL_LOW if state.utilisation_high else UTIL_HIGH))
    state = replace(state, latency_stressed=lat_stressed, queue_stressed=queue_stressed, utilisation_high=util_high)
    target = state.target
    goal = LATENCY_GOAL * slo
    busy = per_replica * (1 - min(queued_share, 0.99))
    # (a) utilisation: the target at which the replicas run at the utilisation aim
    by_util = None
    if util_on and util > 0.01 and busy > 0:
        slots = busy / util                              # a replica's parallel capacity, measured
        headroom = _headroom(config, signals, state, now, per_replica)
        aim = _utilisation_aim(config, p99 if lat_on else None, queued_share, slots)
        by_util = slots * aim * headroom
        if aim > config.target_utilisation:
            # the latency slack buys busy slots, not a queue: what it adds stops at the measured
            # capacity (the plain aim with its headroom is never lowered by it)
            by_util = max(slots * config.target_utilisation * headroom, min(by_util, slots))
    # (b) latency (Little's law): the in-flight count that would put p99 at the goal
    by_latency = per_replica * goal / p99 if lat_on and p99 > 0 else None
    inputs = {"per_replica_in_flight": per_replica, "queued_share": queued_share, "p99_ms": p99,
              "p99_settled_ms": p99_stress,
              "utilisation": util, "latency_stressed": lat_stressed, "queue_stressed": queue_stressed,
              "utilisation_high": util_high, "by_utilisation": by_util, "by_latency": by_latency}
    lat_calm = not lat_on or p99 < slo * LATENCY_LOW
    ceiling = state.ceiling
    contention = _contention(config, queued_share, util if util_on else None)
    queue_cut = queue_stressed and not lat_calm
    if (lat_stressed and contention) or queue_cut:
        # down by the latency excess (relative to the target, not to the in-flight count, which runs
        # below the target between scale-ups), at least MIN_CHANGE, at most max_step_down
        by_excess = (_latency_cut(target, p99_stress, goal, util if util_on else None)
                     if lat_on and p99_stress > 0 else None)
        ceiling = _ceiling_after_stress(target)
        if by_excess is not None and by_excess >= target * (1 - MIN_CHANGE) and not queue_cut:
            # p99 within MIN_CHANGE of the goal (or under it, still above the low mark): no change
            new, how = target, "hold: stressed, change too small"
        else:
            proposal = min(x for x in (by_excess, by_util, target * (1 - MIN_CHANGE)) if x is not None)
            new = max(target * config.max_step_down, proposal)
            how = "decrease: stressed"
    elif by_util is not None and by_util < target * (1 - MIN_CHANGE):
        new = max(target * config.max_step_down, by_util)
        how = "decrease: over the utilisation target"
    elif lat_calm and not queue_stressed:
        proposal = by_util if by_util is not None else (by_latency or target)
        if ceiling is not None:
            ceiling *= 1 + CEILING_LIFT
            proposal = min(proposal, ceiling * (1 - MIN_CHANGE))
        new = min(proposal, target * config.max_step_up)
        how = "increase: calm"
        if new < target * (1 + MIN_CHANGE):
            new, how = target, "hold: calm, change too small"
    else:
        new, how = target, "hold: between marks"
    state = replace(state, ceiling=ceiling)
    new = min(config.max_target, max(config.min_target, new))
    inputs["vertical"] = how
    inputs["target_before"] = target
    return replace(state, target=new), inputs
