"""The scaling configuration of one served entity, validated so that a bad value names its field.

``ScalingConfig.from_mapping`` is what the gateway calls on a user's ``autoscaling`` block: unknown
keys, wrong types and contradictions raise :class:`ScalingConfigError` (a ``ValueError``) whose
``field`` is the offending key, so the API can answer 400 naming it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

# Signals the vertical axis can re-tune from; anything else in ``vertical_metrics`` is refused.
VERTICAL_METRICS = frozenset({"latency", "queue", "utilisation"})
# Fields the autoscaler had and no longer has, with what took their place: refused by name, never ignored.
REMOVED = {
    "up_tolerance": "a scale-up happens at any second the need passes the replicas' capacity, sized for the "
    "scale-up window's peak and the load forecast at a new replica's start; there is no band "
    "on the way up"
}


# What each field of ScalingConfig means, for the docs' reference (generated from this mapping) and for users
# reading the code; tests/unit/test_docs.py checks that every field has its line.
FIELD_DOCS: dict[str, str] = {
    "min_replicas": "replicas kept at least; set on the served entity (`min_replicas`), not in `autoscaling`",
    "max_replicas": "replicas at most; set on the served entity (`max_replicas`, default 4 there)",
    "scale_to_zero": "the last replica may leave once idle; set on the served entity (`scale_to_zero_enabled`)",
    "idle_window_s": "with scale to zero, seconds without a request before the last replica leaves",
    "provisioned_concurrency": "keep replicas for at least this many requests in flight",
    "decision_interval_s": "seconds between two scale-downs (a scale-up happens at any second)",
    "scale_up_window_s": "sizes for the peak load of this window or the load forecast at a new replica's start",
    "scale_down_window_s": "a scale-down goes to the peak load of this window",
    "tolerance": "a scale-down waits until that peak is this share under capacity",
    "vertical": "the vertical axis: the per-replica target moves with what a replica serves well",
    "vertical_interval_s": "seconds between two moves of the per-replica target",
    "initial_target": "the starting per-replica target; left at its default, the replica's profile sets it",
    "min_target": "the per-replica target at least",
    "max_target": "the per-replica target at most",
    "latency_slo_ms": "the p99 goal: the target drops when p99 passes 90 % of it; shedding keeps answers within 80 %",
    "target_utilisation": "the share of a replica's time busy the target aims at",
    "max_step_up": "one vertical move multiplies the target by at most this",
    "max_step_down": "one vertical move multiplies the target by at least this (a fast decrease under stress)",
    "vertical_metrics": "the signals the vertical axis reads: `latency`, `queue`, `utilisation`",
    "admission_headroom": "a replica admits `ceil(target x admission_headroom)` requests at once",
    "max_queue": "requests the gateway holds waiting for a replica, at most",
    "shed_load": "`true`: refuse (429) what the measured throughput cannot answer within 80 % of `latency_slo_ms`; "
    "`false`: hold up to `max_queue` requests, each at most 5 s",
}


class ScalingConfigError(ValueError):
    """A scaling config value is invalid; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class ScalingConfig:
    """Both axes' settings. Defaults are what an endpoint gets when the user sets nothing."""

    # bounds and the provisioned minimum
    min_replicas: int = 1
    max_replicas: int = 1000
    scale_to_zero: bool = False
    idle_window_s: float = 300.0  # no request for this long -> 0 replicas (when enabled)
    provisioned_concurrency: int = 0  # keep capacity for this many in-flight requests at least
    # horizontal axis
    decision_interval_s: float = 5.0
    scale_up_window_s: float = 20.0
    scale_down_window_s: float = 300.0
    tolerance: float = 0.1  # load within this share under capacity: no scale-down
    # vertical axis: per-replica target concurrency (the horizontal denominator)
    vertical: bool = True
    vertical_interval_s: float = 30.0
    initial_target: float = 4.0
    min_target: float = 1.0
    max_target: float = 1024.0
    latency_slo_ms: float = 500.0  # p99 goal the vertical axis protects
    target_utilisation: float = 0.8  # aim: this share of a replica's parallel capacity busy
    max_step_up: float = 4.0  # one vertical cycle multiplies the target by at most this
    max_step_down: float = 0.5  # ...and by at least this (fast decrease under stress)
    vertical_metrics: tuple[str, ...] = ("latency", "queue", "utilisation")
    admission_headroom: float = 1.5  # per-replica admission limit = target x this
    # gateway queue bound. 10,000 as Knative's activator (breakerQueueDepth): 1000 refused bursts
    # of a slow-SLO model (the 10 s io_agent) that its replicas would have drained within the SLO.
    max_queue: int = 10000
    # load shedding: true (the default) bounds the queue, while a replica is ready, by what the measured
    # throughput answers within 80 % of the SLO (the policy's queue_bound): a request past it gets a 429
    # with Retry-After at once instead of a late answer, and those admitted stay within the SLO. false
    # holds up to max_queue, each request at most the dispatcher's 5 s: a burst waits for the replicas a
    # scale-up adds and is answered late, and makes the requests behind it late too. Shedding serves
    # fewer bad requests (late or refused) live and in the simulator (docs/benchmarks/autoscaler.md).
    shed_load: bool = True

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ScalingConfig:
        """Build from user input (JSON/YAML mapping); unknown keys and bad values name their field."""
        if not isinstance(data, Mapping):
            raise ScalingConfigError("autoscaling", "must be an object")
        known = {f.name: f for f in fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key in REMOVED:
                raise ScalingConfigError(str(key), f"no longer a setting: {REMOVED[key]}")
            if key not in known:
                raise ScalingConfigError(str(key), "unknown field")
            if key == "vertical_metrics":
                if isinstance(value, str) or not isinstance(value, (list, tuple)):
                    raise ScalingConfigError(key, "must be a list of metric names")
                value = tuple(value)
            kwargs[key] = value
        return cls(**kwargs)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "bool":
                if not isinstance(value, bool):
                    raise ScalingConfigError(f.name, "must be true or false")
            elif f.type == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ScalingConfigError(f.name, "must be an integer")
            elif f.type == "float" and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            ):
                raise ScalingConfigError(f.name, "must be a finite number")
        for name in ("min_replicas", "provisioned_concurrency", "tolerance"):
            if getattr(self, name) < 0:
                raise ScalingConfigError(name, "must not be negative")
        for name in (
            "max_replicas",
            "max_queue",
            "idle_window_s",
            "decision_interval_s",
            "scale_up_window_s",
            "scale_down_window_s",
            "vertical_interval_s",
            "initial_target",
            "min_target",
            "max_target",
            "latency_slo_ms",
        ):
            if getattr(self, name) <= 0:
                raise ScalingConfigError(name, "must be positive")
        if self.min_replicas > self.max_replicas:
            raise ScalingConfigError(
                "min_replicas", f"({self.min_replicas}) must be <= max_replicas ({self.max_replicas})"
            )
        if self.min_replicas == 0 and not self.scale_to_zero:
            raise ScalingConfigError("min_replicas", "may be 0 only when scale_to_zero is true")
        if self.min_target > self.max_target:
            raise ScalingConfigError("min_target", f"({self.min_target}) must be <= max_target ({self.max_target})")
        if not self.min_target <= self.initial_target <= self.max_target:
            raise ScalingConfigError("initial_target", "must be within [min_target, max_target]")
        if self.scale_down_window_s < self.scale_up_window_s:
            raise ScalingConfigError("scale_down_window_s", "must be >= scale_up_window_s")
        if not 0 < self.target_utilisation <= 1:
            raise ScalingConfigError("target_utilisation", "must be in (0, 1]")
        if self.max_step_up < 1:
            raise ScalingConfigError("max_step_up", "must be >= 1")
        if not 0 < self.max_step_down <= 1:
            raise ScalingConfigError("max_step_down", "must be in (0, 1]")
        if self.admission_headroom < 1:
            raise ScalingConfigError("admission_headroom", "must be >= 1")
        if not isinstance(self.vertical_metrics, tuple) or not all(isinstance(m, str) for m in self.vertical_metrics):
            raise ScalingConfigError("vertical_metrics", "must be a list of metric names")
        unknown = sorted(set(self.vertical_metrics) - VERTICAL_METRICS)
        if unknown:
            raise ScalingConfigError(
                "vertical_metrics", f"unknown metric name(s) {unknown}; known: {sorted(VERTICAL_METRICS)}"
            )
