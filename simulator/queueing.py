"""The requests' side of a step: timeouts, the waiting FIFO taking free servers, arrivals, and the end.

A request that finds a server free when it arrives starts at once; one whose server frees before the
end of the current step is given it and waits for it (its start time is kept in ``later_starts`` until
then, so it counts as queued); any other waits in the FIFO, or is rejected when the waiting room is
full. With batching, a server that frees within the step takes, as one batch, the arrivals that come
before it frees (up to the batch cap); the FIFO's requests are taken a batch at a time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from heapq import heappop, heappush, heapreplace

import numpy as np

from simulator.interface import STEPS_PER_S


class Requests:
    """The trace's requests: arrival and service times (seconds), the FIFO of those waiting for a server,
    and per request its latency once served (NaN: rejected, timed out, or never served)."""

    def __init__(self, arrivals: np.ndarray, service_s: np.ndarray, n_steps: int, end_t: float) -> None:
        self.arrival: list[float] = arrivals.tolist()
        self.service: list[float] = service_s.tolist()
        self.latency: list[float] = [math.nan] * len(self.arrival)
        self.finished_in_step = [0] * (n_steps + 2)
        self.last_step = n_steps + 1  # completions after the end all land in the last step
        self.latencies_in_second: list[list[float]] = [[] for _ in range(int(end_t) + 3)]
        self.last_second = len(self.latencies_in_second) - 1
        self.waiting: deque[int] = deque()  # arrived, without a server yet, in arrival order
        self.later_starts: deque[float] = deque()  # start times of requests given a server they wait for
        self.rejected = 0  # rejected or timed out so far
        self.stretch = 1.0  # services started now take this much longer (cores shared)

    @property
    def queued(self) -> int:
        return len(self.waiting) + len(self.later_starts)

    def finish_batch(self, batch: list[int], done: float) -> None:
        """The requests of ``batch`` are answered at ``done``."""
        self.finished_in_step[min(int(done * STEPS_PER_S), self.last_step)] += len(batch)
        in_second = self.latencies_in_second[min(int(done), self.last_second)]
        for i in batch:
            latency = done - self.arrival[i]
            self.latency[i] = latency
            in_second.append(latency)

    def start_batch(
        self, heap: list[float], batch: list[int], start: float, batch_factor: Callable[[int], float]
    ) -> None:
        """A server (already taken off ``heap``) serves ``batch`` from ``start``."""
        done = start + self.service[batch[0]] * batch_factor(len(batch)) * self.stretch
        heappush(heap, done)
        self.finish_batch(batch, done)

    def started_by(self, now: float) -> None:
        """Requests given a server drop out of the queued ones once it has started them."""
        later = self.later_starts
        while later and later[0] <= now:
            later.popleft()

    def wait_behind(self, i: int, heap: list[float], room: float) -> bool:
        """When others wait or there is no server, request ``i`` waits in the FIFO behind them (or is rejected
        when the waiting room is full): True. False: it may take a server."""
        if not self.waiting and heap:
            return False
        if len(self.waiting) + len(self.later_starts) >= room:
            self.rejected += 1
        else:
            self.waiting.append(i)
        return True

    def serve(self, heap: list[float], i: int, start: float) -> None:
        """Request ``i`` alone on the earliest free server from ``start``, answered when its service ends."""
        done = start + self.service[i] * self.stretch
        heapreplace(heap, done)
        latency = done - self.arrival[i]
        self.latency[i] = latency
        self.finished_in_step[min(int(done * STEPS_PER_S), self.last_step)] += 1
        self.latencies_in_second[min(int(done), self.last_second)].append(latency)

    def expire(self, now: float, timeout: float) -> None:
        """The oldest waiting requests whose timeout has passed get their timeout answer."""
        waiting, arrival = self.waiting, self.arrival
        while waiting and arrival[waiting[0]] + timeout <= now:
            waiting.popleft()
            self.rejected += 1

    def start_waiting(self, heap: list[float], t0: float, t1: float) -> None:
        """The FIFO's requests, in order, take the servers that free before ``t1``."""
        waiting, arrival = self.waiting, self.arrival
        while waiting and heap and heap[0] < t1:
            i = waiting.popleft()
            a = arrival[i]
            free = heap[0]
            start = free if free > a else a
            self.serve(heap, i, start)
            if start > t0:
                self.later_starts.append(start)

    def start_waiting_batched(
        self, heap: list[float], t1: float, cap: int, batch_factor: Callable[[int], float]
    ) -> None:
        """Each server that frees before ``t1`` takes the FIFO's first ``cap`` requests as one batch."""
        waiting = self.waiting
        while waiting and heap and heap[0] < t1:
            free = heappop(heap)
            size = min(cap, len(waiting))
            self.start_batch(heap, [waiting.popleft() for _ in range(size)], free, batch_factor)

    def arrive(
        self,
        lo: int,
        hi: int,
        heap: list[float],
        t1: float,
        room: float,
        cap: int = 1,
        batch_factor: Callable[[int], float] | None = None,
    ) -> None:
        """Requests ``lo`` to ``hi``, those arriving in the step ending at ``t1``. With batching
        (``batch_factor``), a server that frees within the step, at ``forming_at``, takes the arrivals up
        to then (at most ``cap``) as one batch; without, each request takes a server alone."""
        arrival, waiting, later = self.arrival, self.waiting, self.later_starts
        forming: list[int] = []
        forming_at = -1.0
        for i in range(lo, hi):
            a = arrival[i]
            if later and later[0] <= a:
                self.started_by(a)
            if forming:
                if a <= forming_at and len(forming) < cap:
                    forming.append(i)
                    later.append(forming_at)
                    continue
                self.start_batch(heap, forming, forming_at, batch_factor)
                forming = []
            if self.wait_behind(i, heap, room):
                continue
            free = heap[0]
            if free <= a:
                self.serve(heap, i, a)
            elif len(waiting) + len(later) >= room:
                self.rejected += 1
            elif free >= t1:
                waiting.append(i)
            elif batch_factor is None:
                later.append(free)
                self.serve(heap, i, free)
            else:
                heappop(heap)
                forming_at = free
                forming = [i]
                later.append(free)
        if forming:
            self.start_batch(heap, forming, forming_at, batch_factor)

    def drain(self, heap: list[float], timeout: float | None) -> None:
        """After the last step: what still waits is served by what is left, in order (no more arrivals),
        unless it would start past its timeout."""
        waiting, arrival = self.waiting, self.arrival
        while waiting and heap:
            i = waiting.popleft()
            start = max(heap[0], arrival[i])
            if timeout is not None and start - arrival[i] >= timeout:
                continue
            done = start + self.service[i]
            heapreplace(heap, done)
            self.latency[i] = done - arrival[i]
