"""When a replica a policy asks for is ready: cold starts, and a warm pool modelled as configured.

A policy's ``warm_pool`` is its number of standbys:

* ``0``: every replica starts cold (``cold_start_s``: process or pod start, runtime import; then
  ``model_load_s``), as a Kubernetes pod does.
* ``N``: the live gateway's pool (``serving/replicas/warm_pool.py``, ``serving/replicas/local_backend.py``):
  ``N`` standbys idle at t=0; a scale-up takes the idle ones (``warm_start_s`` + ``model_load_s``)
  and starts the rest cold, all at once. Each take is refilled once the replica it became is ready
  (``LocalBackend.spawn`` ends by calling ``refill``), one standby at a time: a refill starts
  when the one before it has finished and takes ``cold_start_s``.
* ``math.inf``: a standby is always there (an unlimited pool, the optimistic bound).
"""

from __future__ import annotations

import bisect
import math

from simulator.profiles import ModelProfile


class Starts:
    """The ready times of the replicas asked for, from the profile's start costs and the standbys."""

    def __init__(self, profile: ModelProfile, standbys: float) -> None:
        if standbys < 0 or (standbys != math.inf and standbys != int(standbys)):
            raise ValueError(f"warm_pool must be a whole number of standbys >= 0 or inf, got {standbys!r}")
        self.cold_s = profile.cold_start_s + profile.model_load_s
        self.warm_s = profile.warm_start_s + profile.model_load_s
        self.refill_s = profile.cold_start_s
        self.idle = standbys
        self.refilled: list[float] = []  # when each standby being refilled is idle, ascending
        self.filler_free_at = 0.0  # the serial refill's next free time
        self.warm_starts = 0
        self.cold_starts = 0

    def _refilled_by(self, now: float) -> None:
        done = bisect.bisect_right(self.refilled, now)
        if done:
            self.idle += done
            del self.refilled[:done]

    def ready_in(self, now: float) -> float:
        """Seconds a replica asked for at ``now`` needs to be ready: warm while a standby is idle, else cold."""
        self._refilled_by(now)
        return self.warm_s if self.idle >= 1 else self.cold_s

    def ready_times(self, now: float, n: int) -> list[float]:
        """Start ``n`` replicas at ``now``: the idle standbys first (warm), the rest cold."""
        self._refilled_by(now)
        warm = int(min(n, self.idle))
        if self.idle != math.inf:
            self.idle -= warm
            for _ in range(warm):
                # the refill asked for once the activated replica is ready, after any refill still running
                self.filler_free_at = max(now + self.warm_s, self.filler_free_at) + self.refill_s
                self.refilled.append(self.filler_free_at)
        self.warm_starts += warm
        self.cold_starts += n - warm
        return [now + self.warm_s] * warm + [now + self.cold_s] * (n - warm)
