"""Admission to a served entity's replicas: a free slot under the concurrency limit, or a bounded
wait for one. Past the queue bound a request is refused at once (429 with Retry-After), so overload
is shed at the door instead of piling up as latency."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TypeVar

from serving.router import HasLoad, pick_replica

R = TypeVar("R", bound=HasLoad)


class AdmissionRefused(Exception):
    """No slot: the queue is full, or the wait for a slot ran out."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class Admission:
    def __init__(self, max_queue: int = 64, max_wait_s: float = 5.0) -> None:
        if max_queue < 0 or max_wait_s <= 0:
            raise ValueError("max_queue must be >= 0 and max_wait_s > 0")
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.waiting = 0
        self._freed = asyncio.Condition()

    async def acquire(self, replicas: Callable[[], Sequence[R]], limit: int | None) -> R:
        """A replica with a free slot (its outstanding count already taken), waiting in line if need be."""
        replica = pick_replica(replicas(), limit)
        if replica is not None:  # no await between the pick and the increment: no one can take the slot
            replica.outstanding += 1
            return replica
        if self.waiting >= self.max_queue:
            raise AdmissionRefused(f"queue full ({self.max_queue} waiting)", retry_after_s=1)
        self.waiting += 1
        try:
            async with self._freed:
                await asyncio.wait_for(self._freed.wait_for(lambda: pick_replica(replicas(), limit) is not None),
                                       self.max_wait_s)
                replica = pick_replica(replicas(), limit)
                assert replica is not None
                replica.outstanding += 1
                return replica
        except asyncio.TimeoutError as exc:
            raise AdmissionRefused(f"no free replica within {self.max_wait_s:.1f}s", retry_after_s=1) from exc
        finally:
            self.waiting -= 1

    async def release(self, replica: HasLoad) -> None:
        replica.outstanding -= 1
        async with self._freed:
            self._freed.notify()

    async def capacity_changed(self) -> None:
        """Replicas were added or limits raised: every waiter re-checks."""
        async with self._freed:
            self._freed.notify_all()
