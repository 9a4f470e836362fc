"""The tollfree policy inside the simulator: the production :class:`EntityScaler`, called as the
controller calls it (one ``observe`` of the second's sample, then ``decide(now)``, every second)."""

from __future__ import annotations

import math
from dataclasses import replace

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import EntityScaler
from serving.autoscaler.policy import max_concurrency_for, seeded
from simulator.baselines import HPA, KPA, RayServe
from simulator.engine import Action, SimPolicy, View
from simulator.profiles import ModelProfile

# serving/__main__.py: TOLLFREE_WARM_POOL's default, one standby (refilled one at a time; see starts.py)
WARM_POOL = 1
# serving/traffic/dispatcher.py: a request waits at most max_wait_s (5.0 by default) in the gateway's queue, then 429
GATEWAY_MAX_WAIT_S = 5.0


def replica_serves(profile: ModelProfile) -> int:
    """What one replica predicts at once, as the gateway's batching plan reads it: a batch (or a request
    unbatched) per worker that predicts side by side."""
    return profile.parallelism * profile.max_batch


class Tollfree:
    name = "tollfree"

    def __init__(
        self,
        config: ScalingConfig,
        warm_pool: float = WARM_POOL,
        profile: ModelProfile | None = None,
        stream_max_lag_s: float | None = None,
    ) -> None:
        # the gateway seeds the starting target from what a replica measured of its model (policy.seeded)
        self.config = seeded(config, replica_serves(profile)) if profile is not None else config
        self.serves = replica_serves(profile) if profile is not None else None
        # fed by a stream whose entries may lag this long: what waits is its backlog (Sample.stream_backlog_per_s)
        self.stream_max_lag_s = stream_max_lag_s
        self.warm_pool = warm_pool
        self.front_queue: float | None = float(config.max_queue)  # the gateway's bounded queue
        self.replica_queue: float | None = 0.0  # the gateway admits at most max_concurrency per replica
        self.timeout_s: float | None = GATEWAY_MAX_WAIT_S
        self.scaler: EntityScaler | None = None
        self.targets: list[tuple[float, float]] = []  # (t, target) after each vertical cycle

    def initial(self, load: float) -> tuple[int, int | None]:
        target = self.config.initial_target
        replicas = max(self.config.min_replicas, math.ceil(load / target))
        self.scaler = EntityScaler(self.config, replicas=replicas, serves=self.serves)
        return replicas, max_concurrency_for(self.config, target)

    def step(self, view: View) -> Action | None:
        if view.second is None:
            return None
        assert self.scaler is not None
        second = view.second
        if self.stream_max_lag_s is not None:
            second = replace(second, stream_backlog_per_s=second.queue_depth / self.stream_max_lag_s)
        self.scaler.observe(second)
        decision = self.scaler.decide(view.now)
        if decision.vertical:
            self.targets.append((view.now, decision.target_concurrency))
        # the gateway's queue: the policy's bound with shed_load, else max_queue (serving/gateway/autoscaling.py)
        self.front_queue = float(decision.queue_limit if self.config.shed_load else self.config.max_queue)
        return Action(replicas=max(decision.replicas, self.scaler.floor), admission_limit=decision.max_concurrency)


def tollfree_config(profile: ModelProfile, **overrides) -> ScalingConfig:
    """The config an endpoint gets with nothing set but its SLO (and the simulated replica cap)."""
    base = {"latency_slo_ms": profile.slo_ms, "max_replicas": profile.max_replicas}
    base.update(overrides)
    return ScalingConfig(**base)


POLICIES = ("tollfree", "hpa", "kpa", "ray")
# The comparison fixes KPA's and Ray's settings at their defaults; those defaults assume a model that holds
# ~100 (KPA) or ~5 (Ray) requests at once. The "-user" variants are what a user of that system would
# set for the profile after a load test: KPA containerConcurrency = the per-pod knee (user_target / 0.7,
# so the target is user_target), Ray target_ongoing_requests = user_target and max_ongoing_requests =
# the knee. Every other setting stays at its default.
USER_VARIANTS = ("kpa-user", "ray-user")


def make_policy(name: str, profile: ModelProfile, warm_pool: float = WARM_POOL, **tollfree_overrides) -> SimPolicy:
    """A fresh policy object by name. HPA's AverageValue target is the profile's ``user_target``;
    ``warm_pool`` (standbys) is tollfree's, the baselines keep their systems' own start behaviour."""
    if name == "tollfree":
        return Tollfree(tollfree_config(profile, **tollfree_overrides), warm_pool=warm_pool, profile=profile)
    if name == "hpa":
        return HPA(target=profile.user_target, max_replicas=profile.max_replicas)
    if name == "kpa":
        return KPA(max_replicas=profile.max_replicas)
    if name == "ray":
        return RayServe(max_replicas=profile.max_replicas)
    knee = max(1, math.ceil(profile.user_target / 0.7 - 1e-9))
    if name == "kpa-user":
        return KPA(container_concurrency=knee, max_replicas=profile.max_replicas, name=name)
    if name == "ray-user":
        return RayServe(
            max_replicas=profile.max_replicas, target_ongoing=profile.user_target, max_ongoing=knee, name=name
        )
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES + USER_VARIANTS)} or all")
