"""What a served entity's load was over the last sampling period, measured at the gateway. Pure.

The dispatcher tells the meter when a request arrives, when a replica starts and stops predicting it, and
when it completes; ``read(now)`` returns the period's time-averaged in-flight count and queue depth,
arrivals, completions and their latency percentiles, then starts a new period. A request is in service
only while a replica predicts it: one that waits in the gateway's queue or inside a replica (behind the
call the replica is predicting) is queued, so busy requests over completions is the model's service time,
as the autoscaler's ``Sample`` defines it. Time is passed in, so tests step it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoadReading:
    seconds: float
    in_flight: float  # mean over the period, queued included
    queue_depth: float  # mean over the period: waiting at the gateway or inside a replica
    arrivals: int
    completed: int
    latency_p50_ms: float | None
    latency_p99_ms: float | None


def _percentile(sorted_values: list[float], q: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


class LoadMeter:
    MAX_LATENCIES = 100_000  # per period; beyond it the percentiles use the first ones

    def __init__(self, now: float) -> None:
        self._start = now
        self._changed = now
        self.in_flight = 0
        self.serving = 0  # of in_flight, those a replica is predicting
        self._in_flight_area = 0.0
        self._serving_area = 0.0
        self._arrivals = 0
        self._latencies: list[float] = []

    def _advance(self, now: float) -> None:
        dt = max(0.0, now - self._changed)
        self._in_flight_area += self.in_flight * dt
        self._serving_area += min(self.serving, self.in_flight) * dt
        self._changed = max(now, self._changed)

    def arrived(self, now: float) -> None:
        self._advance(now)
        self.in_flight += 1
        self._arrivals += 1

    def turned_away(self, now: float) -> None:
        """A request refused at the door (429): demand all the same."""
        self._advance(now)
        self._arrivals += 1

    def started(self, now: float, n: int = 1) -> None:
        """A replica began predicting ``n`` requests (one call)."""
        self._advance(now)
        self.serving += n

    def stopped(self, now: float, n: int = 1) -> None:
        """A replica's call of ``n`` requests ended (answered, failed or timed out)."""
        self._advance(now)
        self.serving = max(0, self.serving - n)

    def finished(self, now: float, latency_s: float | None) -> None:
        """A request left the entity (answered, failed, expired in the queue or given up); its latency if answered."""
        self._advance(now)
        self.in_flight = max(0, self.in_flight - 1)
        if latency_s is not None and len(self._latencies) < self.MAX_LATENCIES:
            self._latencies.append(latency_s * 1000)

    def read(self, now: float) -> LoadReading:
        self._advance(now)
        seconds = max(now - self._start, 1e-9)
        latencies = sorted(self._latencies)
        reading = LoadReading(
            seconds=seconds,
            in_flight=self._in_flight_area / seconds,
            queue_depth=max(0.0, self._in_flight_area - self._serving_area) / seconds,
            arrivals=self._arrivals,
            completed=len(latencies),
            latency_p50_ms=_percentile(latencies, 0.50) if latencies else None,
            latency_p99_ms=_percentile(latencies, 0.99) if latencies else None,
        )
        self._start = now
        self._in_flight_area = self._serving_area = 0.0
        self._arrivals = 0
        self._latencies = []
        return reading
