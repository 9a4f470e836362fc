"""What the engine and its callers share: the step constants, what a policy sees (:class:`View`) and
returns (:class:`Action`), the :class:`SimPolicy` protocol, and what a run gives back (:class:`Result`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from serving.autoscaler.signals import Sample

STEP_S = 0.1
STEPS_PER_S = 10
TAIL_S = 30.0  # simulated after the last arrival
INF = float("inf")


@dataclass(frozen=True)
class View:
    """What a policy observes at a step boundary."""

    now: float
    in_flight: int
    queued: int
    ready: int
    provisioned: int
    second: Sample | None  # set at full seconds


@dataclass(frozen=True)
class Action:
    replicas: int | None = None  # None: unchanged
    admission_limit: int | None = None  # per-replica limit; None: unchanged


class SimPolicy(Protocol):
    name: str
    warm_pool: float  # standbys (0: cold starts; math.inf: always warm), see starts.py
    front_queue: float | None  # extra waiting room besides the replicas'; INF: unbounded
    replica_queue: float | None  # per ready replica; None: the model server's own (profile.queue_limit)
    timeout_s: float | None  # a request waiting this long is answered with a timeout; None: never

    def initial(self, load: float) -> tuple[int, int | None]:
        """Replicas ready at t=0 for an initial in-flight ``load``, and the per-replica admission limit."""
        ...

    def step(self, view: View) -> Action | None: ...


@dataclass
class Result:
    policy: str
    trace: str
    profile: str
    requests: int
    rejected: int
    over_slo: int
    replica_seconds: float
    p50_ms: float
    p99_ms: float
    time_to_capacity_s: float | None
    scale_events: int
    timeline: dict = field(default_factory=dict, repr=False)  # per second: t, rps, replicas, ready, p99_ms, limit, bad

    @property
    def over_slo_share(self) -> float:
        return self.over_slo / self.requests if self.requests else 0.0

    @property
    def bad(self) -> int:
        """Requests that were rejected or answered over the SLO."""
        return self.over_slo + self.rejected

    def summary(self) -> dict:
        return {
            "requests": self.requests,
            "replica_seconds": round(self.replica_seconds, 1),
            "over_slo_share": round(self.over_slo_share, 6),
            "over_slo": self.over_slo,
            "rejected": self.rejected,
            "p50_ms": round(self.p50_ms, 2),
            "p99_ms": round(self.p99_ms, 2),
            "time_to_capacity_s": None if self.time_to_capacity_s is None else round(self.time_to_capacity_s, 1),
            "scale_events": self.scale_events,
        }
