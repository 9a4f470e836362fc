"""What users run today, re-implemented from the sources with their defaults (each cited).

Paths cited in the Knative and Ray sections are in those projects' repositories (knative/serving,
ray-project/ray), not in this one.

These are simulator policies (:class:`simulator.engine.SimPolicy`): they observe a
:class:`View` every 100 ms and return an :class:`Action`. Each keeps to its own cadence, and each
brings the queueing of its system's request path at its defaults (``front_queue``, ``replica_queue``,
``timeout_s``): where the system puts no limit, requests wait (and count over the SLO when they
waited too long), they are not rejected.

* :class:`HPA` -- Kubernetes HorizontalPodAutoscaler (autoscaling/v2) on a Pods metric "in-flight
  requests" with an ``AverageValue`` target.
* :class:`KPA` -- Knative Pod Autoscaler, concurrency metric, every default untouched.
* :class:`RayServe` -- Ray Serve's default ``replica_queue_length_autoscaling_policy``.
"""

from __future__ import annotations

import math
from collections import deque

from simulator.engine import INF, Action, View

# -- Kubernetes HPA --------------------------------------------------------------------------------
# kube-controller-manager flags (cmd/kube-controller-manager/app/options/hpacontroller.go):
HPA_SYNC_S = 15.0  # --horizontal-pod-autoscaler-sync-period=15s
HPA_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance=0.1
HPA_DOWNSCALE_WINDOW_S = 300.0  # --horizontal-pod-autoscaler-downscale-stabilization=5m0s
# pkg/apis/autoscaling/v2/defaults.go: default scaleUp rules
HPA_UP_PERCENT = 100  # scaleUpLimitPercent = 100
HPA_UP_PODS = 4  # scaleUpLimitMinimumPods = 4
HPA_UP_PERIOD_S = 15.0  # scaleUpPeriod = 15 (selectPolicy Max; stabilization 0)
# default scaleDown rules: 100 % per 15 s (no rate limit in practice), stabilisation from the flag above.


class HPA:
    """horizontal.go + replica_calculator.go (``calcPlainMetricReplicas``), for a Pods metric.

    Every 15 s: usage = mean in-flight per pod that has metrics (ready pods). Pods still starting have
    no metrics ("missing"): on a scale-up they count as 0, on a scale-down as the target, and the
    recommendation is dropped if that flips its direction. ``|1 - ratio| <= 0.1`` keeps the count.
    Then ``stabilizeRecommendation``: the max of the recommendations of the last 300 s bounds a
    scale-down; scale-up is limited to ``max(+4 pods, +100 %)`` per 15 s counted from the scale
    events of the period (``getReplicasChangePerPeriod``). minReplicas 1.

    The concurrency metric comes from the pods' own counters (a custom metric); we give HPA the
    freshest value (the mean over the last second), the best case for it.
    """

    name = "hpa"
    warm_pool = 0  # a new pod: scheduling, container start, runtime import, model load
    # A Service (kube-proxy) forwards connections and holds nothing: no queue of its own, no timeout
    # (pkg/proxy: iptables/IPVS rules only). What waits, waits in the pod's model server (its own room,
    # ``profile.queue_limit``: unbounded for a plain HTTP server).
    front_queue: float | None = None
    replica_queue: float | None = None
    timeout_s: float | None = None

    def __init__(self, target: float, min_replicas: int = 1, max_replicas: int = 1000) -> None:
        self.target = target
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.recommendations: deque[tuple[float, int]] = deque()
        self.scale_events: deque[tuple[float, int]] = deque()
        self.spec = 0
        self.last_sync: float | None = None
        self.last_sample = None

    def initial(self, load: float) -> tuple[int, int | None]:
        self.spec = max(self.min_replicas, math.ceil(load / self.target))
        return self.spec, None

    def _proposal(self, view: View) -> int:
        sample = self.last_sample
        ready, spec = view.ready, self.spec
        missing = max(0, spec - ready)
        if sample is None or ready == 0:
            return spec  # no metrics: the HPA keeps the scale
        usage = sample.in_flight / ready
        ratio = usage / self.target
        if missing == 0:
            if abs(1.0 - ratio) <= HPA_TOLERANCE:
                return spec
            return math.ceil(ratio * ready)
        fill = self.target if ratio < 1.0 else 0.0
        new_ratio = (usage * ready + fill * missing) / (self.target * (ready + missing))
        if abs(1.0 - new_ratio) <= HPA_TOLERANCE or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
            return spec
        new = math.ceil(new_ratio * (ready + missing))
        if (new_ratio < 1.0 and new > spec) or (new_ratio > 1.0 and new < spec):
            return spec
        return new

    def step(self, view: View) -> Action | None:
        if view.second is not None:
            self.last_sample = view.second
        now = view.now
        if self.last_sync is not None and now - self.last_sync < HPA_SYNC_S - 1e-9:
            return None
        self.last_sync = now
        desired = max(self.min_replicas, min(self.max_replicas, self._proposal(view)))
        # stabilizeRecommendationWithBehaviors: up window 0, down window 300 s (max of recommendations)
        while self.recommendations and self.recommendations[0][0] <= now - HPA_DOWNSCALE_WINDOW_S:
            self.recommendations.popleft()
        down = max([desired] + [r for _, r in self.recommendations])
        self.recommendations.append((now, desired))
        stabilized = self.spec
        if stabilized < desired:
            stabilized = desired
        if stabilized > down:
            stabilized = down
        # convertDesiredReplicasWithBehaviorRate: scale-up limit over the last period
        while self.scale_events and self.scale_events[0][0] <= now - HPA_UP_PERIOD_S:
            self.scale_events.popleft()
        added = sum(c for _, c in self.scale_events if c > 0)
        period_start = self.spec - added
        up_limit = max(period_start + HPA_UP_PODS, math.ceil(period_start * (1 + HPA_UP_PERCENT / 100)))
        new = min(stabilized, up_limit, self.max_replicas)
        new = max(new, self.min_replicas)
        if new != self.spec:
            self.scale_events.append((now, new - self.spec))
            self.spec = new
            return Action(replicas=new)
        return None


# -- Knative KPA -----------------------------------------------------------------------------------
# Knative's config/core/configmaps/autoscaler.yaml and pkg/autoscaler/config/config.go defaults:
KPA_TARGET = 100.0  # container-concurrency-target-default: "100"
KPA_UTILISATION = 0.7  # container-concurrency-target-percentage: "70"
KPA_STABLE_S = 60  # stable-window: "60s"
KPA_PANIC_S = 6  # panic-window-percentage: "10.0" (of the stable window) -> 6 s
KPA_PANIC_THRESHOLD = 2.0  # panic-threshold-percentage: "200.0"
KPA_TICK_S = 2.0  # tick-interval: 2s (pkg/autoscaler/config: TickInterval)
KPA_MAX_UP = 1000.0  # max-scale-up-rate: "1000.0"
KPA_MAX_DOWN = 2.0  # max-scale-down-rate: "2.0"
KPA_ZERO_GRACE_S = 30.0  # scale-to-zero-grace-period: "30s" (enable-scale-to-zero: "true")
KPA_TBC = 211.0  # target-burst-capacity: "211" (activator in the path while spare capacity < it)
KPA_ACTIVATOR_QUEUE = 10000  # pkg/activator/net/throttler.go: breakerQueueDepth = 10000
# Knative's config/core/configmaps/defaults.yaml revision-timeout-seconds: "300" (pkg/apis/config/defaults.go
# DefaultRevisionTimeoutSeconds = 5 * 60): a request not answered by then gets a timeout.
KPA_TIMEOUT_S = 300.0
# pkg/queue/sharedmain/main.go buildBreaker: no breaker when containerConcurrency < 1 (the default 0:
# every request is proxied to the user container and waits there); otherwise at most
# containerConcurrency in the container and a queue of 10 x containerConcurrency in front of it
# ("queueDepth := 10 * env.ContainerConcurrency"), beyond which the queue-proxy answers 503.
KPA_BREAKER_QUEUE_FACTOR = 10


class KPA:
    """pkg/autoscaler/scaling/autoscaler.go ``Scale`` with the defaults above.

    Every 2 s: observed stable / panic concurrency = mean of the per-second concurrency over the last
    60 s / 6 s; ``dspc = ceil(stable / 70)``, ``dppc = ceil(panic / 70)``, both clamped to
    ``[floor(ready / 2), ceil(1000 x ready)]``; panic starts when ``dppc / ready >= 2`` and ends 60 s
    after the last time it held; while panicking the count never goes down. At 0 desired pods the
    revision goes to zero after the 30 s grace period; while at zero the activator holds up to 10,000
    requests and its stat wakes the autoscaler. containerConcurrency 0 (unlimited) is the default.

    Queueing: with containerConcurrency 0 nothing limits what reaches a pod (no queue-proxy breaker,
    the activator's per-revision breaker is infinite too), so requests wait in the pod up to the 300 s
    revision timeout. With containerConcurrency set, the queue-proxy admits that many and queues
    10 x as many; the activator, in the path whenever the spare capacity ``ready x cc - panic
    concurrency`` is below the 211 target burst capacity (``excessBCF`` in ``Scale``), or at zero,
    holds up to 10,000 more.
    """

    name = "kpa"
    warm_pool = 0  # a new pod, as HPA's (Knative keeps no standby pods)
    timeout_s: float | None = KPA_TIMEOUT_S

    def __init__(self, container_concurrency: int = 0, max_replicas: int = 1000, name: str = "kpa") -> None:
        # containerConcurrency 0 (the default): target = container-concurrency-target-default x 70 %;
        # set: target = containerConcurrency x 70 %, and the queue-proxy admits at most that many.
        self.name = name
        self.cc = container_concurrency
        self.target = (container_concurrency or KPA_TARGET) * KPA_UTILISATION
        self.max_replicas = max_replicas
        self.window: deque[float] = deque(maxlen=KPA_STABLE_S)
        self.panic_time: float | None = None
        self.max_panic_pods = 0
        self.last_tick: float | None = None
        self.zero_since: float | None = None
        self.current = 0
        self.front_queue: float | None = None
        self.replica_queue: float | None = (
            KPA_BREAKER_QUEUE_FACTOR * container_concurrency if container_concurrency > 0 else None
        )
        self.panic_value = 0.0

    def initial(self, load: float) -> tuple[int, int | None]:
        self.current = max(1, math.ceil(load / self.target))
        return self.current, (self.cc or None)

    def step(self, view: View) -> Action | None:
        # the activator is in the path while no pod is ready, or (target burst capacity) while the
        # spare capacity is under 211: then it buffers -- when it has a limit to enforce (cc > 0)
        total = self.cc or KPA_TARGET
        ebc = math.floor(view.ready * total - KPA_TBC - self.panic_value)
        self.front_queue = KPA_ACTIVATOR_QUEUE if view.ready == 0 or (self.cc and ebc < 0) else None
        if view.second is not None:
            self.window.append(view.second.in_flight)
        now = view.now
        if self.last_tick is not None and now - self.last_tick < KPA_TICK_S - 1e-9:
            return None
        self.last_tick = now
        if not self.window:
            return None
        samples = list(self.window)
        stable = sum(samples) / len(samples)
        recent = samples[-KPA_PANIC_S:]
        panic = sum(recent) / len(recent)
        self.panic_value = panic
        ready = max(1.0, float(view.ready))
        max_up = math.ceil(KPA_MAX_UP * ready)
        max_down = math.floor(ready / KPA_MAX_DOWN)
        dspc = math.ceil(stable / self.target)
        dppc = math.ceil(panic / self.target)
        stable_pods = int(min(max(dspc, max_down), max_up))
        panic_pods = int(min(max(dppc, max_down), max_up))
        over = dppc / ready >= KPA_PANIC_THRESHOLD
        if (self.panic_time is None and over) or over:
            self.panic_time = now
        elif self.panic_time is not None and now > self.panic_time + KPA_STABLE_S:
            self.panic_time = None
            self.max_panic_pods = 0
        desired = stable_pods
        if self.panic_time is not None:
            desired = max(desired, panic_pods)
            if desired > self.max_panic_pods:
                self.max_panic_pods = desired
            desired = self.max_panic_pods
        desired = min(desired, self.max_replicas)
        if desired == 0:
            # KPA reconciler: to zero only after the grace period (activator takes over the path)
            if self.zero_since is None:
                self.zero_since = now
            if now - self.zero_since < KPA_ZERO_GRACE_S:
                desired = max(1, self.current) if self.current else 0
        else:
            self.zero_since = None
        if desired != self.current:
            self.current = desired
            return Action(replicas=desired)
        return None


# -- Ray Serve -------------------------------------------------------------------------------------
# Ray's python/ray/serve/config.py AutoscalingConfig defaults and num_replicas="auto"
# (Ray's doc/source/serve/autoscaling-guide.md):
RAY_TARGET_ONGOING = 2.0  # target_ongoing_requests: 2
RAY_MAX_ONGOING = 5  # max_ongoing_requests: 5 (per replica; beyond: queued at the router)
RAY_UPSCALE_DELAY_S = 30.0  # upscale_delay_s: 30.0
RAY_DOWNSCALE_DELAY_S = 600.0  # downscale_delay_s: 600.0
RAY_LOOK_BACK_S = 30.0  # look_back_period_s: 30.0 (mean of the ongoing requests)
RAY_CONTROL_LOOP_S = 0.1  # Ray's ray/serve/_private/constants.py: CONTROL_LOOP_INTERVAL_S = 0.1
# max_queued_requests: -1 (Ray's ray/serve/_private/constants.py DEFAULT_MAX_QUEUED_REQUESTS = -1): the
# router queue beyond max_ongoing_requests has no limit; HTTPOptions.request_timeout_s: None
# (Ray's python/ray/serve/config.py): no timeout either.


class RayServe:
    """Ray's python/ray/serve/autoscaling_policy.py: ``replica_queue_length_autoscaling_policy``.

    Every 0.1 s: ``desired = running x total / (target x running)`` (total = ongoing requests, queued
    ones included, averaged over the 30 s look-back), ``_apply_scaling_factors`` (factor 1),
    ``_apply_bounds``, then ``_apply_delay_logic``: a scale-up happens only after the decision has been
    "up" for more than ``int(30 / 0.1)`` consecutive loops, a scale-down after ``int(600 / 0.1)``.
    """

    name = "ray"
    # Ray starts a replica actor in an idle pre-started worker process when the raylet has one (its worker
    # pool prestarts about one per CPU); modelled as always there: the optimistic bound for Ray
    warm_pool = INF
    front_queue: float | None = INF  # the router's queue: unbounded
    replica_queue: float | None = 0.0  # a replica gets at most max_ongoing_requests
    timeout_s: float | None = None

    def __init__(
        self,
        min_replicas: int = 1,
        max_replicas: int = 1000,
        target_ongoing: float = RAY_TARGET_ONGOING,
        max_ongoing: int = RAY_MAX_ONGOING,
        name: str = "ray",
    ) -> None:
        self.name = name
        self.target_ongoing = target_ongoing
        self.max_ongoing = max_ongoing
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.samples: deque[int] = deque(maxlen=int(RAY_LOOK_BACK_S / RAY_CONTROL_LOOP_S))
        self.total = 0
        self.counter = 0
        self.target_replicas = 0

    def initial(self, load: float) -> tuple[int, int | None]:
        self.target_replicas = max(self.min_replicas, math.ceil(load / self.target_ongoing))
        return self.target_replicas, self.max_ongoing

    def step(self, view: View) -> Action | None:
        if len(self.samples) == self.samples.maxlen:
            self.total -= self.samples[0]
        self.samples.append(view.in_flight)
        self.total += view.in_flight
        running = view.ready
        if running == 0:
            # _get_cold_start_scale_up_replicas
            return None
        total = self.total / len(self.samples)
        desired_f = running * (total / (self.target_ongoing * running))
        # _apply_scaling_factors (upscaling/downscaling factor 1.0)
        scaled = math.ceil(running + 1.0 * (desired_f - running))
        if math.ceil(desired_f) < running and scaled == running:
            scaled -= 1
        bounded = max(self.min_replicas, min(self.max_replicas, scaled))
        # _apply_delay_logic
        decision = self.target_replicas
        if bounded > self.target_replicas:
            if self.counter < 0:
                self.counter = 0
            self.counter += 1
            if self.counter > int(RAY_UPSCALE_DELAY_S / RAY_CONTROL_LOOP_S):
                self.counter = 0
                decision = bounded
        elif bounded < self.target_replicas:
            if self.counter > 0:
                self.counter = 0
            self.counter -= 1
            if self.counter < -int(RAY_DOWNSCALE_DELAY_S / RAY_CONTROL_LOOP_S):
                self.counter = 0
                decision = max(1, bounded)
        else:
            self.counter = 0
        if decision != self.target_replicas:
            self.target_replicas = decision
            return Action(replicas=decision)
        return None
