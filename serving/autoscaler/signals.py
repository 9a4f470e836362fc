"""Signals: per-second samples of one served entity and a bounded history of them.

The gateway (or the simulator) produces one :class:`Sample` per second per served entity (its fields'
contract is in its docstring). :class:`SampleHistory` keeps the last few minutes and hands the policy
an immutable :class:`Signals` snapshot; the policy reads its windows from it (``Signals.since``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One second of one served entity, ``t`` being the end of the second. The contract both producers meet
    (the gateway's ``GatewaySignals`` and the simulator's engine; ``tests/unit/test_sample_contract.py``):

    - ``in_flight``: requests admitted and not yet answered, a time-average over the second, queued included;
    - ``queue_depth``: of ``in_flight``, those not being predicted: waiting at the gateway, or inside a
      replica behind the call it predicts. ``in_flight - queue_depth`` is what is in service, and that over
      ``completed`` is the model's service time;
    - ``ready_replicas`` serve now; ``replicas`` are provisioned (ready and starting);
    - ``requests``: arrivals in the second, those turned away with a 429 included (demand all the same);
      ``completed``: answers in the second;
    - ``latency_p50_ms`` / ``latency_p99_ms``: of the requests answered in the second (None: none answered);
    - ``utilisation``: the busy share of the ready replicas' parallel capacity, 0..1 (live, each replica's
      busy clock: the seconds its predict calls ran);
    - ``stream_backlog_per_s``: stream entries waiting in the broker for this entity over their stream's
      ``max_lag_s``, the arrivals a second it must serve on top of the others to drain them in time;
    - ``cores`` / ``cores_busy``: for replicas that share one machine, its cores and the share of them busy
      over the second, whoever uses them (0 and None for replicas on machines of their own, pods);
    - ``ready_in_s``: how long a replica asked for now needs to serve: a standby's activation while one is
      idle, else a cold start (a process, a pod), as the backend measured its last ones (0: cannot say).
    """

    t: float
    in_flight: float
    ready_replicas: int
    replicas: int = 0
    queue_depth: float = 0.0
    requests: int = 0
    completed: int = 0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    utilisation: float | None = None
    stream_backlog_per_s: float = 0.0
    cores: int = 0
    cores_busy: float | None = None
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
    def last(self) -> Sample | None:
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

    @property
    def latest(self) -> Sample | None:
        """The newest sample, without a snapshot's copy of them all."""
        return self._samples[-1] if self._samples else None

    def __len__(self) -> int:
        return len(self._samples)
