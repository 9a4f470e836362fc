"""Signals: per-second samples of one served entity and a bounded history of them.

The gateway (or the simulator) produces one :class:`Sample` per second per served entity: requests in
flight (a time-average over the second, queued ones included), what waits, latency over the second,
and the replicas' utilisation. :class:`SampleHistory` keeps the last few minutes and hands the policy
an immutable :class:`Signals` snapshot; the policy reads its windows from it (``Signals.since``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Sample:
    """One second of one served entity (``t`` is the end of the second)."""

    t: float
    in_flight: float                      # requests in flight, mean over the second, queued included
    ready_replicas: int
    replicas: int = 0                     # provisioned (starting + ready)
    queue_depth: float = 0.0              # of in_flight, how many were waiting (gateway + replica queues)
    requests: int = 0                     # arrivals during the second
    completed: int = 0                    # responses during the second
    latency_p50_ms: Optional[float] = None  # over requests completed during the second
    latency_p99_ms: Optional[float] = None
    utilisation: Optional[float] = None   # busy share of the ready replicas' parallel capacity, 0..1
    per_replica_in_flight: tuple[float, ...] = ()
    # stream entries waiting in the broker for this entity, divided by their stream's max_lag_s: the events a
    # second it must serve on top of its current throughput to drain the backlog in time (0: no stream lag)
    stream_backlog_per_s: float = 0.0
    # the machine the replicas share (local replicas): its cores, and the share of them busy over the second,
    # whoever uses them (replicas, the gateway, clients on the same machine); 0 and None elsewhere
    cores: int = 0
    cores_busy: Optional[float] = None
    # seconds a replica asked for now needs to be ready to serve: a standby's activation while one is idle, else
    # a cold start (a process, a pod), as the backend measured its last ones; 0 when it cannot say
    ready_in_s: float = 0.0


@dataclass(frozen=True)
class Signals:
    """An immutable view of recent samples, oldest first."""

    samples: tuple[Sample, ...]

    def since(self, start: float) -> tuple[Sample, ...]:
        """Samples with ``t > start`` (the samples are in time order)."""
        out = []
        for s in reversed(self.samples):
            if s.t <= start:
                break
            out.append(s)
        out.reverse()
        return tuple(out)

    @property
    def last(self) -> Optional[Sample]:
        return self.samples[-1] if self.samples else None


class SampleHistory:
    """The collector's side: a bounded, append-only buffer of samples (the only mutable piece)."""

    def __init__(self, keep_s: float) -> None:
        if keep_s <= 0:
            raise ValueError("keep_s must be positive")
        self.keep_s = keep_s
        self._samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        if self._samples and sample.t <= self._samples[-1].t:
            raise ValueError(f"sample at t={sample.t} is not after the last one (t={self._samples[-1].t})")
        self._samples.append(sample)
        horizon = sample.t - self.keep_s
        while self._samples and self._samples[0].t <= horizon:
            self._samples.popleft()

    def snapshot(self) -> Signals:
        return Signals(tuple(self._samples))

    def __len__(self) -> int:
        return len(self._samples)
