"""One stream input's consumer: read micro-batches from the source's consumer group, score them, write each
entry's result or dead letter to the sink exactly once, then acknowledge.

The loop, per session (a session ends on a broker error and the next begins after a back-off):
1. make sure the consumer group exists;
2. finish what this consumer held when its last process stopped: its own pending entries, re-read from
   the group, checked against the sink's markers (those already written are only acknowledged);
3. then, repeatedly: claim entries other consumers left pending longer than ``claim_idle_s`` (a gateway
   that died) and treat them the same way; read up to ``batch_size`` new entries (waiting up to
   ``max_wait_ms`` to fill a partial batch) and score them, with at most ``max_batches`` batches in flight
   (the bound on events in flight: ``batch_size * max_batches``). A full pipeline stops the reads, so
   the backlog stays in the broker, where the lag metric and the autoscaler see it.

``score`` gives each entry's output: a result, a dead letter (the event itself is bad: a missing field, a
wrong type, an unknown entity, a model failure on it) or None (no capacity now: queue full, no replica,
a timeout), in which case the entry is scored again after a back-off, and nothing after it in its batch
is acknowledged before it is.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from serving.streams.broker import Entry, Lag, Output, Sink, Source
from serving.streams.config import StreamInput

log = logging.getLogger(__name__)

Score = Callable[[Sequence[Entry]], Awaitable[list[Output | None]]]

MAX_BACKOFF_S = 5.0


@dataclass
class ConsumerStats:
    """Counters since the consumer started (the gateway's metrics read them)."""

    results: int = 0
    dead_letters: int = 0
    duplicates: int = 0  # entries delivered again whose output was already in the sink
    retries: int = 0  # entries scored again after no capacity
    broker_errors: int = 0
    in_flight: int = 0
    lag: Lag = field(default_factory=lambda: Lag(0, 0, 0.0))
    lag_at: float = 0.0  # when ``lag`` was read (the clock's time; 0: never)


class StreamConsumer:
    def __init__(
        self,
        endpoint: str,
        config: StreamInput,
        source: Source,
        sink: Sink,
        score: Score,
        *,
        consumer: str,
        claim_idle_s: float = 30.0,
        max_batches: int = 4,
        retry_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.endpoint = endpoint
        self.config = config
        self.source = source
        self.sink = sink
        self.score = score
        self.consumer = consumer
        self.claim_idle_s = claim_idle_s
        self.max_batches = max_batches
        self.retry_s = retry_s
        self.clock = clock
        self.stats = ConsumerStats()
        self._stream = config.source_address.stream
        self._sink = config.sink_address.stream
        self._dead = config.dead_letter_address.stream
        self._marker_prefix = f"tollfree:done:{config.source_address.url}:{config.group}:"
        self._failure: BaseException | None = None

    @property
    def name(self) -> str:
        return self.config.source_address.url

    async def run(self) -> None:
        """Consume until cancelled; broker errors end a session, and the next starts after a back-off."""
        backoff = 0.5
        while True:
            tasks: set[asyncio.Task[None]] = set()
            try:
                await self._session(tasks)
            except (RedisError, OSError) as exc:
                self.stats.broker_errors += 1
                log.warning(
                    "stream %s of endpoint %s: broker error (%s); again in %.1f s",
                    self.name,
                    self.endpoint,
                    type(exc).__name__,
                    backoff,
                )
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)  # their entries stay pending: read again
                self.stats.in_flight = 0
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF_S, backoff * 2)

    async def lag(self, now_ms: int) -> Lag:
        lag = await self.source.lag(self._stream, self.config.group, now_ms)
        self.stats.lag, self.stats.lag_at = lag, self.clock()
        return lag

    # ---- a session -----------------------------------------------------------------------------
    async def _session(self, tasks: set[asyncio.Task[None]]) -> None:
        self._failure = None
        group, size = self.config.group, self.config.batch_size
        await self.source.ensure_group(self._stream, group)
        while own := await self.source.read(self._stream, group, self.consumer, size, None, pending=True):
            await self._process(own, again=True)
        slots = asyncio.Semaphore(self.max_batches)
        next_claim = 0.0
        while True:
            if self._failure is not None:
                raise self._failure
            if self.clock() >= next_claim:
                next_claim = self.clock() + self.claim_idle_s / 2
                idle_ms = int(self.claim_idle_s * 1000)
                claimed = await self.source.claim(self._stream, group, self.consumer, idle_ms, size)
                if claimed:
                    log.info("stream %s: claimed %d entries a stopped consumer left pending", self.name, len(claimed))
                    await self._process(claimed, again=True)
            await slots.acquire()
            try:
                entries = await self._read_batch(size)
            except BaseException:
                slots.release()
                raise
            if not entries:
                slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._process(entries, again=False))
            tasks.add(task)
            task.add_done_callback(lambda done: self._finished(done, tasks, slots))

    async def _read_batch(self, size: int) -> list[Entry]:
        group = self.config.group
        entries = await self.source.read(self._stream, group, self.consumer, size, 1000)
        if entries and len(entries) < size and self.config.max_wait_ms > 0:
            entries += await self.source.read(
                self._stream, group, self.consumer, size - len(entries), self.config.max_wait_ms
            )
        return entries

    def _finished(self, task: asyncio.Task[None], tasks: set[asyncio.Task[None]], slots: asyncio.Semaphore) -> None:
        tasks.discard(task)
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            self._failure = task.exception()  # the session ends at the loop's next turn

    # ---- one batch -----------------------------------------------------------------------------
    async def _process(self, entries: list[Entry], *, again: bool) -> None:
        """Score, write, acknowledge. ``again``: the entries may have been written before (redelivered)."""
        self.stats.in_flight += len(entries)
        try:
            markers = {e.id: self._marker_prefix + e.id for e in entries}
            done = await self.sink.written(list(markers.values())) if again else set()
            todo = [e for e in entries if markers[e.id] not in done]
            self.stats.duplicates += len(entries) - len(todo)
            outputs = await self._score_final(todo)
            appended = await self.sink.write(self._sink, self._dead, [(markers[o.event_id], o) for o in outputs])
            await self.source.ack(self._stream, self.config.group, [e.id for e in entries])
            await self.sink.settle(list(markers.values()))
            self.stats.duplicates += len(outputs) - appended  # another consumer wrote them meanwhile
            dead = sum(o.dead for o in outputs)
            self.stats.dead_letters += dead
            self.stats.results += len(outputs) - dead  # counted once written and acknowledged
        finally:
            self.stats.in_flight -= len(entries)

    async def _score_final(self, entries: list[Entry]) -> list[Output]:
        """Every entry's result or dead letter; those without capacity are scored again after a back-off."""
        outputs: list[Output] = []
        left, delay = entries, self.retry_s
        while left:
            scored = await self.score(left)
            outputs.extend(o for o in scored if o is not None)
            left = [e for e, o in zip(left, scored) if o is None]
            if left:
                self.stats.retries += len(left)
                await asyncio.sleep(delay)
                delay = min(MAX_BACKOFF_S, delay * 2)
        return outputs
