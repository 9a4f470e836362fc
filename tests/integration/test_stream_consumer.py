"""The stream consumer and the Redis broker against a real redis-server, with a scoring function of the test's
own in place of the gateway's (the gateway's door is tested end to end in tests/e2e/test_streams.py).

Holds: each entry's output is written once and the entry acknowledged; an entry redelivered after its output
was written but before its acknowledgement (the gateway died in between) is acknowledged without a second
output; a stopped consumer's pending entries are claimed by the next and scored once; entries without capacity
are scored again until they are, and nothing is acknowledged before its output is written; dead letters keep
the original fields; the lag counts what is unread and pending, with the oldest entry's age.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

import pytest
import redis

from infra.redis import RedisServer
from serving.streams.broker import Entry, Output, RedisStreams
from serving.streams.config import StreamInput
from serving.streams.consumer import StreamConsumer


@pytest.fixture
def server(stream_broker: RedisServer) -> RedisServer:
    return stream_broker


@pytest.fixture
def names(request: pytest.FixtureRequest) -> tuple[str, str, str]:
    base = request.node.name[:40]
    return f"{base}:in", f"{base}:out", f"{base}:dead"


def _config(server: RedisServer, names: tuple[str, str, str], **extra: object) -> StreamInput:
    source, sink, dead = (f"{server.url}/{n}" for n in names)
    return StreamInput(source=source, sink=sink, dead_letter=dead, group="g", **extra)  # type: ignore[arg-type]


async def _score(entries: Sequence[Entry]) -> list[Output | None]:
    """Results for ``x``, a dead letter for an entry without it."""
    out: list[Output | None] = []
    for e in entries:
        if b"x" in e.fields:
            out.append(Output(e.id, {b"event_id": e.id.encode(), b"prediction": e.fields[b"x"]}))
        else:
            out.append(Output(e.id, {**e.fields, b"event_id": e.id.encode(), b"reason": b"missing x"}, dead=True))
    return out


async def _until(check, timeout_s: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def _event_ids(client: redis.Redis, stream: str) -> collections.Counter[str]:
    return collections.Counter(f[b"event_id"].decode() for _, f in client.xrange(stream))


def test_each_entry_is_written_once_then_acknowledged_and_dead_letters_keep_their_fields(server, names) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis(port=server.port)
    ids = [client.xadd(names[0], {"x": str(i)} if i % 10 else {"y": "bad"}).decode() for i in range(250)]

    async def run() -> None:
        broker = RedisStreams("127.0.0.1", server.port)
        consumer = StreamConsumer("e", _config(server, names, batch_size=32), broker, broker, _score, consumer="c1")
        task = asyncio.get_running_loop().create_task(consumer.run())

        async def drained() -> bool:
            return (
                await broker.lag(names[0], "g", 0)
            ).entries == 0 and consumer.stats.results + consumer.stats.dead_letters == 250

        await _until(drained)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()

    asyncio.run(run())
    results, dead = _event_ids(client, names[1]), _event_ids(client, names[2])
    assert set(results) == {i for n, i in enumerate(ids) if n % 10} and set(results.values()) == {1}
    assert set(dead) == {i for n, i in enumerate(ids) if n % 10 == 0} and set(dead.values()) == {1}
    letter = client.xrange(names[2], count=1)[0][1]
    assert letter[b"y"] == b"bad" and letter[b"reason"] == b"missing x"
    assert client.xpending(names[0], "g")["pending"] == 0


def test_a_redelivered_entry_whose_output_was_written_is_only_acknowledged(server, names) -> None:  # type: ignore[no-untyped-def]
    """The crash between the sink's write and the acknowledgement, replayed: the first consumer writes and is
    cancelled before it acknowledges; the restarted one (same name) finds its pending entries already written."""
    client = redis.Redis(port=server.port)
    ids = [client.xadd(names[0], {"x": str(i)}).decode() for i in range(40)]

    async def run() -> tuple[int, int]:
        broker = RedisStreams("127.0.0.1", server.port)
        config = _config(server, names, batch_size=40)
        first = StreamConsumer("e", config, broker, broker, _score, consumer="c1")
        await broker.ensure_group(names[0], "g")
        entries = await broker.read(names[0], "g", "c1", 40, None)
        marker = first._marker_prefix
        outputs = await _score(entries)
        await broker.write(names[1], names[2], [(marker + o.event_id, o) for o in outputs if o is not None])
        # ... and the process dies here: nothing acknowledged
        second = StreamConsumer("e", config, broker, broker, _score, consumer="c1")
        task = asyncio.get_running_loop().create_task(second.run())

        async def acked() -> bool:
            return client.xpending(names[0], "g")["pending"] == 0

        await _until(acked)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()
        return second.stats.duplicates, second.stats.results

    duplicates, results = asyncio.run(run())
    assert (duplicates, results) == (40, 0)
    assert _event_ids(client, names[1]) == collections.Counter(dict.fromkeys(ids, 1))


def test_a_stopped_consumers_pending_entries_are_claimed_and_scored_once(server, names) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis(port=server.port)
    ids = [client.xadd(names[0], {"x": str(i)}).decode() for i in range(30)]

    async def run() -> None:
        broker = RedisStreams("127.0.0.1", server.port)
        await broker.ensure_group(names[0], "g")
        taken = await broker.read(names[0], "g", "gone", 30, None)  # delivered to a consumer that then died
        assert len(taken) == 30
        consumer = StreamConsumer("e", _config(server, names), broker, broker, _score, consumer="c2", claim_idle_s=0.2)
        task = asyncio.get_running_loop().create_task(consumer.run())

        async def done() -> bool:
            return consumer.stats.results == 30

        await _until(done)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()

    asyncio.run(run())
    assert _event_ids(client, names[1]) == collections.Counter(dict.fromkeys(ids, 1))
    assert client.xpending(names[0], "g")["pending"] == 0


def test_entries_without_capacity_are_scored_again_and_stay_pending_until_written(server, names) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis(port=server.port)
    ids = [client.xadd(names[0], {"x": str(i)}).decode() for i in range(10)]
    refusals = {"left": 3}
    pending_while_refused: list[int] = []

    async def busy_then_free(entries: Sequence[Entry]) -> list[Output | None]:
        if refusals["left"]:
            refusals["left"] -= 1
            pending_while_refused.append(client.xpending(names[0], "g")["pending"])
            return [None] * len(entries)
        return await _score(entries)

    async def run() -> int:
        broker = RedisStreams("127.0.0.1", server.port)
        consumer = StreamConsumer(
            "e", _config(server, names), broker, broker, busy_then_free, consumer="c1", retry_s=0.01
        )
        task = asyncio.get_running_loop().create_task(consumer.run())

        async def done() -> bool:
            return consumer.stats.results == 10 and client.xpending(names[0], "g")["pending"] == 0

        await _until(done)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await broker.close()
        return consumer.stats.retries

    assert asyncio.run(run()) == 30
    assert pending_while_refused == [10, 10, 10]
    assert _event_ids(client, names[1]) == collections.Counter(dict.fromkeys(ids, 1))


def test_lag_counts_unread_and_pending_entries_and_the_oldest_ones_age(server, names) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis(port=server.port)
    ids = [client.xadd(names[0], {"x": str(i)}).decode() for i in range(12)]
    first_ms = int(ids[0].split("-")[0])

    async def run() -> tuple:  # type: ignore[type-arg]
        broker = RedisStreams("127.0.0.1", server.port)
        await broker.ensure_group(names[0], "g")
        before = await broker.lag(names[0], "g", first_ms + 5_000)
        await broker.read(names[0], "g", "c1", 5, None)
        during = await broker.lag(names[0], "g", first_ms + 5_000)
        await broker.ack(names[0], "g", ids[:5])
        after = await broker.lag(names[0], "g", first_ms + 5_000)
        await broker.close()
        return before, during, after

    before, during, after = asyncio.run(run())
    assert (before.unread, before.pending) == (12, 0) and before.oldest_age_s == pytest.approx(5.0, abs=0.01)
    assert (during.unread, during.pending) == (7, 5) and during.oldest_age_s == pytest.approx(5.0, abs=0.01)
    assert (after.unread, after.pending) == (7, 0)
    assert after.oldest_age_s == pytest.approx((first_ms + 5_000 - int(ids[5].split("-")[0])) / 1000, abs=0.01)
