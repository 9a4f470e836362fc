"""The servers: the replicas' ready times and a heap of the servers' next free times.

Each ready or starting replica contributes ``slots`` servers (its parallelism, fewer under a lower
per-replica admission limit); a starting replica's servers are first free at its ready time.
"""

from __future__ import annotations

import bisect
import heapq

from simulator.profiles import ModelProfile
from simulator.starts import Starts


class Pool:
    """Replicas (their ready times) and the heap of server free times."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        self.ready_at: list[float] = []
        self.slots = profile.parallelism
        self.heap: list[float] = []

    def slots_for(self, limit: int | None) -> int:
        p = self.profile
        if p.max_batch > 1 or limit is None:
            return p.parallelism
        return max(1, min(p.parallelism, limit))

    def ready(self, now: float) -> int:
        return bisect.bisect_right(self.ready_at, now + 1e-12)  # ready_at stays sorted

    def resize(self, now: float, replicas: int, starts: Starts, slots: int) -> None:
        heap = self.heap
        if slots != self.slots:
            diff = slots - self.slots
            if diff > 0:
                for r in self.ready_at:
                    heap.extend([max(now, r)] * diff)
            else:
                heap.sort()
                # drop, per replica, |diff| servers: the earliest free (idle first) ones
                drop = -diff * len(self.ready_at)
                del heap[:drop]
            heapq.heapify(heap)
            self.slots = slots
        n = len(self.ready_at)
        if replicas > n:
            for t in starts.ready_times(now, replicas - n):
                self.ready_at.append(t)
                for _ in range(self.slots):
                    heapq.heappush(heap, t)
            self.ready_at.sort()  # a warm start asked for now can be ready before a cold one asked earlier
        elif replicas < n:
            remove = n - replicas
            starting = [r for r in self.ready_at if r > now]
            cancel = min(remove, len(starting))
            if cancel:
                gone = starting[-cancel:]
                del self.ready_at[n - cancel :]
                counts: dict[float, int] = {}
                for r in gone:
                    counts[r] = counts.get(r, 0) + self.slots
                kept = []
                for f in heap:
                    c = counts.get(f, 0)
                    if c:
                        counts[f] = c - 1
                    else:
                        kept.append(f)
                heap[:] = kept
            rest = remove - cancel
            if rest:
                # the oldest ready replicas go; their servers are the earliest free ones (a busy one
                # finishes the request it holds: drain)
                del self.ready_at[:rest]
                heap.sort()
                del heap[: rest * self.slots]
            heapq.heapify(heap)
