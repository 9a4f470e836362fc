"""Feeds the console's timeline from the autoscaler: after each step of the leading gateway's autoscaler, one
point per served entity from the sample it just took and the state it just decided (``timeline.Point``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from serving.autoscaler.controller import EntityScaler
from serving.console.timeline import EntityKey, Point, Timeline


class TimelineRecorder:
    """``server_errors`` gives the 5xx answers counted so far by entity (the gateway's metrics); each point
    carries those of its second."""

    def __init__(self, timeline: Timeline, server_errors: Callable[[], Mapping[EntityKey, float]]) -> None:
        self.timeline = timeline
        self._server_errors = server_errors
        self._errors_before: Mapping[EntityKey, float] = {}

    def record(self, scalers: Mapping[EntityKey, EntityScaler], standby: int, now: float) -> None:
        """A point at ``now`` (wall clock) for each entity the autoscaler has sampled."""
        errors = self._server_errors()
        for key, scaler in scalers.items():
            sample = scaler.history.latest
            if sample is None:
                continue
            new_errors = errors.get(key, 0.0) - self._errors_before.get(key, 0.0)
            self.timeline.add(
                key,
                Point(
                    t=now,
                    desired=scaler.state.replicas,
                    ready=sample.ready_replicas,
                    provisioned=sample.replicas,
                    standby=standby,
                    requests=sample.requests,
                    completed=sample.completed,
                    errors=max(0, round(new_errors)),
                    p50_ms=sample.latency_p50_ms,
                    p99_ms=sample.latency_p99_ms,
                    queue=sample.queue_depth,
                    in_flight=sample.in_flight,
                    target=scaler.state.target,
                ),
            )
        self._errors_before = errors
        self.timeline.keep_only(set(scalers))
