"""The console's history: one point a second per served entity, for the last hour, from the autoscaler's step.

Each second the autoscaler of the leading gateway takes one sample per served entity and decides
(``serving.gateway.autoscaling``); the timeline keeps, per entity, what the console charts: the replicas asked
for, ready and provisioned, the standby processes idle, requests and answers, 5xx answers, p50 and p99, the
queue and what is in flight, and the per-replica target concurrency. Pure: the caller gives the time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass

KEEP_S = 3600.0

EntityKey = tuple[str, str]  # (endpoint, served entity)


@dataclass(frozen=True)
class Point:
    t: float  # wall-clock seconds (the end of the sampled second)
    desired: int  # replicas the autoscaler asks for
    ready: int  # replicas serving
    provisioned: int  # ready and starting
    standby: int  # idle standby processes of the warm pool (the gateway's, shared by its entities)
    requests: int  # arrivals in the second (429s included)
    completed: int  # answers in the second
    errors: int  # 5xx answers in the second
    p50_ms: float | None
    p99_ms: float | None
    queue: float  # waiting, time-averaged over the second
    in_flight: float  # admitted and not answered, time-averaged (queued included)
    target: float  # per-replica target concurrency (the vertical axis)

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


class Timeline:
    """Points per entity, the last ``keep_s`` seconds of them; safe to read while the autoscaler writes."""

    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._points: dict[EntityKey, deque[Point]] = {}
        self._lock = threading.Lock()

    def add(self, key: EntityKey, point: Point) -> None:
        with self._lock:
            points = self._points.setdefault(key, deque())
            if points and point.t <= points[-1].t:
                return  # not after the last one: a second step in the same second (a poke) adds nothing
            points.append(point)
            while points and points[0].t < point.t - self.keep_s:
                points.popleft()

    def keep_only(self, keys: set[EntityKey]) -> None:
        """Forget the entities no longer served (a removed endpoint, a replaced version)."""
        with self._lock:
            for key in set(self._points) - keys:
                del self._points[key]

    def since(self, endpoint: str, after: float) -> dict[str, list[Point]]:
        """The endpoint's points later than ``after``, by served entity."""
        with self._lock:
            return {
                entity: [p for p in points if p.t > after]
                for (name, entity), points in self._points.items()
                if name == endpoint
            }

    def last(self, endpoint: str, seconds: float) -> Mapping[str, list[Point]]:
        """The endpoint's points of the last ``seconds`` before its newest point, by served entity."""
        with self._lock:
            out = {}
            for (name, entity), points in self._points.items():
                if name == endpoint and points:
                    newest = points[-1].t
                    out[entity] = [p for p in points if p.t > newest - seconds]
            return out
