"""The per-second record: the :class:`Sample` a policy gets at every full second (means over the
second's steps, latency p50/p99 of the requests completed in it, utilisation = busy share of the
replicas' parallel capacity; with a shared machine, its cores and their busy share) and, when asked
for, the timeline drawn by ``--plot``."""

from __future__ import annotations

import math

import numpy as np

from serving.autoscaler.signals import Sample
from simulator.interface import STEPS_PER_S
from simulator.profiles import ModelProfile

TIMELINE_KEYS = ("t", "rps", "replicas", "ready", "p99_ms", "limit", "bad")


class Seconds:
    """Accumulates the steps of the current second; ``close`` turns them into its Sample (and a timeline
    row: per second after the warm-up, t, arrivals, replicas provisioned and ready, p99, the admission
    limit and the requests rejected or answered over the SLO)."""

    def __init__(self, profile: ModelProfile, timeline: bool, warmup_s: float) -> None:
        self.slo_s = profile.slo_ms / 1000.0
        self.keep_timeline = timeline
        self.warmup_s = warmup_s
        self.timeline: dict[str, list] = {key: [] for key in TIMELINE_KEYS} if timeline else {}
        self.rejected_mark = 0  # rejections counted up to the previous timeline row
        self.in_flight = 0.0
        self.queued = 0.0
        self.utilisation = 0.0
        self.requests = 0
        self.completed = 0
        self.cores = profile.machine_cores
        self.cores_busy = 0.0

    def add_step(self, in_flight: int, queued: int, capacity: int, completed: int, cores_busy: float = 0.0) -> None:
        busy = in_flight - queued
        self.cores_busy += cores_busy
        self.in_flight += in_flight
        self.queued += queued
        self.utilisation += (busy / capacity) if capacity else (1.0 if in_flight else 0.0)
        self.completed += completed

    def close(
        self,
        sec: int,
        latencies: list[float],
        ready: int,
        provisioned: int,
        limit: int | None,
        rejected: int,
        ready_in_s: float = 0.0,
    ) -> Sample:
        """The Sample of second ``sec`` (``latencies``: of the requests completed in it; ``rejected``: so far)."""
        p50 = p99 = None
        if latencies:
            la = np.asarray(latencies) * 1000.0
            p50, p99 = (float(x) for x in np.percentile(la, (50, 99)))
        sample = Sample(
            t=float(sec),
            in_flight=self.in_flight / STEPS_PER_S,
            ready_replicas=ready,
            replicas=provisioned,
            queue_depth=self.queued / STEPS_PER_S,
            requests=self.requests,
            completed=self.completed,
            latency_p50_ms=p50,
            latency_p99_ms=p99,
            utilisation=min(1.0, self.utilisation / STEPS_PER_S),
            cores=self.cores,
            cores_busy=min(1.0, self.cores_busy / STEPS_PER_S) if self.cores else None,
            ready_in_s=ready_in_s,
        )
        if self.keep_timeline:
            if sec > self.warmup_s + 1e-9:
                self._row(sec, latencies, ready, provisioned, limit, rejected, p99)
            self.rejected_mark = rejected
        self.in_flight = self.queued = self.utilisation = self.cores_busy = 0.0
        self.requests = self.completed = 0
        return sample

    def _row(
        self,
        sec: int,
        latencies: list[float],
        ready: int,
        provisioned: int,
        limit: int | None,
        rejected: int,
        p99: float | None,
    ) -> None:
        tl = self.timeline
        tl["t"].append(float(sec) - self.warmup_s)
        tl["rps"].append(self.requests)
        tl["replicas"].append(provisioned)
        tl["ready"].append(ready)
        tl["p99_ms"].append(math.nan if p99 is None else p99)
        tl["limit"].append(math.nan if limit is None else float(limit))
        tl["bad"].append(sum(1 for x in latencies if x > self.slo_s) + rejected - self.rejected_mark)
