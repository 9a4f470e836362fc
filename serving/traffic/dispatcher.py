"""Per served entity: admission, a bounded queue, and micro-batches sent to the least-loaded replica.

Every admitted request waits in the entity's queue until a replica has room. When one has, the
dispatcher takes the waiting requests (up to the model's batch size, when its replicas found that
batching pays; one at a time otherwise) and sends them as one call. Requests thus batch exactly when
they would queue anyway: a lone request never waits for company, so single-request latency is
untouched. When the replica is busy and fewer requests wait than a batch holds, the batch may wait
the plan's short ``max_wait_ms`` for more (``serving.traffic.batching``).

Limits, as before: at most ``limit`` requests in flight per replica (its concurrency limit), at most
``depth`` batches in flight per replica when batching (one predicting, one arriving), at most
``max_queue`` waiting (then 429 at once), at most ``max_wait_s`` in the queue (then 429), and
``timeout_s`` for the replica's answer (then 504).

A replica that cannot be reached is left out of the routing for ``EJECT_S`` (as Envoy ejects an outlier), its
owner is told (``on_lost``: a dead replica's replacement starts at once), and its batch goes back to the front
of the queue, to be sent once more (predictions are idempotent) to another replica or to the replacement; a
request whose second replica cannot be reached either, or that finds none before its wait runs out, answers
503. While a lost replica's replacement starts
(``replacing``), requests are held for it rather than refused: the queue takes up to ``queue_cap`` and a
request waits up to ``HOLD_S``, as Knative's activator holds requests for a revision's pods.

A replica predicts one call at a time (one predict thread), in the order they reach it: of a replica's
calls in flight the oldest is in service and the others wait inside it. The load meter is told so, and
counts those requests as queued (``LoadMeter.started`` / ``stopped``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from serving.protocol.errors import ApiError, timeout, unavailable
from serving.protocol.wire import ReplicaUnreachable, WireAnswer, WireReply, WireRequest
from serving.traffic.batching import OFF, BatchPlan
from serving.traffic.load_meter import LoadMeter
from serving.traffic.replica import Replica
from serving.traffic.router import pick_replica

log = logging.getLogger(__name__)

PIPELINE_DEPTH = 2
SENDS = 2  # a request goes to a replica at most this often: once, and once more if the first was unreachable
EJECT_S = 1.0  # an unreachable replica gets no call for this long
HOLD_S = 30.0  # a request waits at most this long for a lost replica's replacement


SendBatch = Callable[[Replica, list[WireRequest]], Awaitable[WireReply]]


class AdmissionRefused(Exception):
    """No room: the queue is full, or the wait for a replica ran out (a 429 with Retry-After)."""

    def __init__(self, reason: str, retry_after_s: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class _QueuedRequest:
    """A request waiting in the dispatcher's queue for a batch, and the future its answer resolves."""

    request: WireRequest
    future: asyncio.Future[WireAnswer]
    enqueued: float
    expiry: asyncio.TimerHandle | None = None
    sends: int = 0  # times it went to a replica
    unreachable: bool = False  # its last replica could not be reached


@dataclass(eq=False)
class _Call:
    """One envelope in flight at a replica: its requests' count."""

    size: int


@dataclass
class DispatchStats:
    """Counters for metrics and the autoscaler's signals."""

    batches: int = 0
    batched_requests: int = 0
    refused: int = 0
    retried: int = 0
    largest_batch: int = 0
    inflight_batches: dict[str, int] = field(default_factory=dict)  # replica id -> batches in flight


class Dispatcher:
    def __init__(
        self,
        send: SendBatch,
        replicas: Callable[[], Sequence[Replica]],
        *,
        limit: Callable[[], int | None] = lambda: None,
        max_queue: int = 64,
        max_wait_s: float = 5.0,
        timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_queue < 0 or max_wait_s <= 0 or timeout_s <= 0:
            raise ValueError("max_queue must be >= 0, max_wait_s and timeout_s > 0")
        self._send = send
        self._replicas = replicas
        self._limit = limit
        self.max_queue = max_queue
        self.max_wait_s = max_wait_s
        self.timeout_s = timeout_s
        self._clock = clock
        self.plan: BatchPlan = OFF
        self._queue: collections.deque[_QueuedRequest] = collections.deque()
        self._gather: asyncio.TimerHandle | None = None
        self.stats = DispatchStats()
        self.meter = LoadMeter(clock())
        self.on_starved: Callable[[], None] | None = None  # called when a request arrives and no replica is up
        self._busy: dict[str, float] = {}  # replica id -> its busy clock, as its last reply carried it
        self._calls: dict[str, collections.deque[_Call]] = {}  # replica id -> its calls in flight, oldest first
        self._ejected: dict[str, float] = {}  # replica id -> when it may be called again (it could not be reached)
        self.on_lost: Callable[[Replica], None] | None = None  # told of a replica that could not be reached
        self.replacing: Callable[[], bool] = lambda: False  # a lost replica's replacement is starting
        self.queue_cap = max_queue  # what the queue holds at most while ``replacing`` (``max_queue`` may shed below)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def in_flight(self) -> int:
        return sum(r.outstanding for r in self._replicas())

    async def submit(self, request: WireRequest) -> WireAnswer:
        """The replica's answer to ``request``; AdmissionRefused or ApiError (503/504) otherwise."""
        pending = self._enqueue(request)
        self._pump()
        self._wake()
        return await pending.future

    async def submit_many(self, requests: Sequence[WireRequest]) -> list[WireAnswer | Exception]:
        """Each request's answer, or its AdmissionRefused / ApiError, in order. They join the queue together
        before anything is sent, so they leave in envelopes as large as the plan allows (a stream's
        micro-batch), where requests arriving one by one would leave one by one while a replica is free."""
        entered: list[_QueuedRequest | AdmissionRefused] = []
        for request in requests:
            try:
                entered.append(self._enqueue(request))
            except AdmissionRefused as refused:
                entered.append(refused)
        self._pump()
        self._wake()
        waiting = [e.future for e in entered if isinstance(e, _QueuedRequest)]
        answers: Iterator[WireAnswer | BaseException] = iter(await asyncio.gather(*waiting, return_exceptions=True))
        out: list[WireAnswer | Exception] = []
        for e in entered:
            answer = e if isinstance(e, AdmissionRefused) else next(answers)
            if not isinstance(answer, (WireAnswer, Exception)):  # a cancelled future (never by the dispatcher)
                raise answer
            out.append(answer)
        return out

    @property
    def queue_limit(self) -> int:
        """How many requests may wait now before the next is refused: ``max_queue``, or ``queue_cap`` if larger
        while a lost replica's replacement starts."""
        return max(self.max_queue, self.queue_cap) if self.replacing() else self.max_queue

    def _enqueue(self, request: WireRequest) -> _QueuedRequest:
        if len(self._queue) >= self.queue_limit and self._pick() is None:
            self.stats.refused += 1
            self.meter.turned_away(self._clock())
            raise AdmissionRefused(f"queue full ({self.max_queue} waiting)", retry_after_s=1)
        loop = asyncio.get_running_loop()
        now = self._clock()
        pending = _QueuedRequest(request, loop.create_future(), now)
        self._queue.append(pending)
        self.meter.arrived(now)
        pending.expiry = loop.call_later(self.max_wait_s, self._expire, pending)
        return pending

    def _wake(self) -> None:
        if self.on_starved is not None and not any(r.alive() for r in self._replicas()):
            self.on_starved()  # scale from zero now, not at the autoscaler's next tick

    def capacity_changed(self) -> None:
        """Replicas were added, limits raised or the plan changed: send what can go now."""
        self._pump()

    def busy_clocks(self) -> dict[str, float]:
        """Replica id -> the busy clock its last reply carried, for the current replicas (the autoscaler's
        utilisation signal); readings of replicas that left are dropped."""
        current = {r.id for r in self._replicas()}
        for gone in self._busy.keys() - current:
            del self._busy[gone]
        return dict(self._busy)

    # ---- internals -----------------------------------------------------------------------------
    def _expire(self, pending: _QueuedRequest) -> None:
        if pending not in self._queue:
            return  # already sent
        held = HOLD_S - (self._clock() - pending.enqueued)
        if self.replacing() and held > 0:  # a replacement is coming: wait for it, not only max_wait_s
            pending.expiry = asyncio.get_running_loop().call_later(min(held, self.max_wait_s), self._expire, pending)
            return
        self._queue.remove(pending)
        if pending.unreachable:
            self._settle(pending, error=_unreachable())
            return
        self.stats.refused += 1
        self._settle(pending, error=AdmissionRefused(f"no free replica within {self.max_wait_s:.1f}s", retry_after_s=1))

    def _settle(
        self, pending: _QueuedRequest, answer: WireAnswer | None = None, error: Exception | None = None
    ) -> None:
        """The request's outcome, once; the meter counts it as finished either way."""
        now = self._clock()
        self.meter.finished(now, now - pending.enqueued if answer is not None else None)
        if pending.future.done():
            return  # its caller went away
        if answer is not None:
            pending.future.set_result(answer)
        else:
            pending.future.set_exception(error or unavailable("no answer"))

    def _drop_abandoned(self) -> None:
        while self._queue and self._queue[0].future.done():  # the caller went away while it waited
            pending = self._queue.popleft()
            if pending.expiry is not None:
                pending.expiry.cancel()
            self.meter.finished(self._clock(), None)

    def _pick(self) -> Replica | None:
        depth = PIPELINE_DEPTH if self.plan.enabled else None
        batches = self.stats.inflight_batches
        if self._ejected:
            now = self._clock()
            self._ejected = {key: until for key, until in self._ejected.items() if until > now}
        candidates = [
            r
            for r in self._replicas()
            if r.id not in self._ejected and r.alive() and (depth is None or batches.get(r.id, 0) < depth)
        ]
        return pick_replica(candidates, self._limit())

    def _pump(self) -> None:
        while self._queue:
            self._drop_abandoned()
            if not self._queue:
                return
            replica = self._pick()
            if replica is None:
                return
            room = self.plan.max_batch if self.plan.enabled else 1
            limit = self._limit()
            if limit is not None:
                room = max(1, min(room, limit - replica.outstanding))
            if self._should_gather(room):
                return
            batch: list[_QueuedRequest] = []
            while self._queue and len(batch) < room:
                pending = self._queue.popleft()
                if pending.expiry is not None:
                    pending.expiry.cancel()
                if pending.future.done():
                    self.meter.finished(self._clock(), None)
                    continue
                batch.append(pending)
            if batch:
                self._dispatch(replica, batch)

    def _should_gather(self, room: int) -> bool:
        """Hold a short partial batch while other batches are in flight, for at most the plan's wait."""
        if not self.plan.enabled or self.plan.max_wait_ms <= 0 or len(self._queue) >= room:
            return False
        if not any(self.stats.inflight_batches.values()):
            return False  # the replicas are idle: a lone request goes at once
        waited = self._clock() - self._queue[0].enqueued
        left = self.plan.max_wait_ms / 1000 - waited
        if left <= 0:
            return False
        if self._gather is None:

            def again() -> None:
                self._gather = None
                self._pump()

            self._gather = asyncio.get_running_loop().call_later(left, again)
        return True

    def _dispatch(self, replica: Replica, batch: list[_QueuedRequest]) -> None:
        for pending in batch:
            pending.sends += 1
        replica.outstanding += len(batch)
        key = replica.id
        self.stats.inflight_batches[key] = self.stats.inflight_batches.get(key, 0) + 1
        self.stats.batches += 1
        self.stats.batched_requests += len(batch)
        self.stats.largest_batch = max(self.stats.largest_batch, len(batch))
        call = _Call(len(batch))
        calls = self._calls.setdefault(key, collections.deque())
        calls.append(call)
        if len(calls) == 1:
            self.meter.started(self._clock(), call.size)
        asyncio.get_running_loop().create_task(self._run(replica, batch, call))

    def _call_ended(self, replica: Replica, call: _Call) -> None:
        """A call left its replica: if it was the one in service, the next one there starts."""
        key = replica.id
        calls = self._calls.get(key)
        if not calls or call not in calls:
            return
        head = calls[0] is call
        calls.remove(call)
        now = self._clock()
        if head:
            self.meter.stopped(now, call.size)
            if calls:
                self.meter.started(now, calls[0].size)
        if not calls:
            del self._calls[key]

    async def _run(self, replica: Replica, batch: list[_QueuedRequest], call: _Call) -> None:
        unreachable = False
        try:
            try:
                reply = await asyncio.wait_for(self._send(replica, [p.request for p in batch]), self.timeout_s)
            finally:
                self._call_ended(replica, call)
        except TimeoutError:
            self._fail(batch, lambda: timeout(f"the model did not answer within {self.timeout_s:.0f}s"))
        except ReplicaUnreachable:
            unreachable = True
        except Exception:  # a bug here must not leave callers hanging
            log.exception("dispatch to a replica failed")
            self._fail(batch, _unreachable)
        else:
            if reply.busy_s is not None:
                self._busy[replica.id] = reply.busy_s
            for pending, answer in zip(batch, reply.answers):
                self._settle(pending, answer)
        finally:
            replica.outstanding -= len(batch)
            key = replica.id
            left = self.stats.inflight_batches.get(key, 1) - 1
            if left:
                self.stats.inflight_batches[key] = left
            else:
                self.stats.inflight_batches.pop(key, None)
        if unreachable:
            self._unreachable_replica(replica, batch)
        self._pump()

    def _unreachable_replica(self, replica: Replica, batch: list[_QueuedRequest]) -> None:
        """``replica`` could not be reached: it is ejected, its owner told, and each request of the batch
        that has a send left goes back to the front of the queue (the others answer 503)."""
        self._ejected[replica.id] = self._clock() + EJECT_S
        loop = asyncio.get_running_loop()
        loop.call_later(EJECT_S, self._pump)  # it may be called again then
        if self.on_lost is not None:
            self.on_lost(replica)
        again = [p for p in batch if p.sends < SENDS and not p.future.done()]
        self._fail([p for p in batch if p not in again], _unreachable)
        self.stats.retried += len(again)
        for pending in reversed(again):
            pending.unreachable = True
            self._queue.appendleft(pending)
            left = max(0.0, self.max_wait_s - (self._clock() - pending.enqueued))
            pending.expiry = loop.call_later(left, self._expire, pending)

    def _fail(self, batch: Sequence[_QueuedRequest], error: Callable[[], ApiError]) -> None:
        for pending in batch:
            self._settle(pending, error=error())


def _unreachable() -> ApiError:
    return unavailable("no replica of this endpoint could be reached")
