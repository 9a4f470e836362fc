"""The broker behind stream inputs: where events come from (``Source``) and where results go (``Sink``),
and their Redis Streams implementation (``RedisStreams``, redis-py's asyncio client).

Delivery is at-least-once from the source (a consumer group: an entry stays pending until acknowledged,
and a dead consumer's pending entries are claimed by the next with ``XAUTOCLAIM``) and exactly-once into
the sink: ``Sink.write`` appends each result (or dead letter) together with a marker for its source entry
in one Lua script, so it is atomic on the sink's server, and an entry whose marker exists is never
appended again. Only then is the entry acknowledged (``Source.ack``), and its marker is given a lifetime
(``MARKER_TTL_S``) that outlasts any concurrent delivery of the same entry; a marker of an entry that was
written but never acknowledged (the gateway died in between) has no expiry, so its redelivery finds it.

A Kafka adapter would implement the same two protocols; none is written, since no broker but Redis runs here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

MARKER_TTL_S = 600  # an acknowledged entry's marker lives this long: far past a claim's idle time

Fields = dict[bytes, bytes]


@dataclass(frozen=True)
class Entry:
    id: str
    fields: Fields


@dataclass(frozen=True)
class Output:
    """One source entry's outcome: a result for the sink, or (``dead``) a dead letter."""

    event_id: str
    fields: Fields
    dead: bool = False


@dataclass(frozen=True)
class Lag:
    """A consumer group's backlog: entries not yet delivered (``unread``), delivered but not acknowledged
    (``pending``), and the age in seconds of the oldest of either (0 when there is none)."""

    unread: int
    pending: int
    oldest_age_s: float

    @property
    def entries(self) -> int:
        return self.unread + self.pending


class Source(Protocol):
    async def ensure_group(self, stream: str, group: str) -> None: ...
    async def read(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]: ...
    async def claim(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]: ...
    async def ack(self, stream: str, group: str, ids: Sequence[str]) -> None: ...
    async def lag(self, stream: str, group: str, now_ms: int) -> Lag: ...


class Sink(Protocol):
    async def written(self, markers: Sequence[str]) -> set[str]: ...
    async def write(self, sink: str, dead_letter: str, outputs: Sequence[tuple[str, Output]]) -> int: ...
    async def settle(self, markers: Sequence[str]) -> None: ...


# KEYS: sink stream, dead-letter stream, one marker per output. ARGV: per output, its kind ("r" or "d"),
# its field count, then its fields and values. Returns how many outputs were appended.
_WRITE = """
local at = 1
local appended = 0
for i = 3, #KEYS do
  local kind = ARGV[at]
  local n = tonumber(ARGV[at + 1])
  local fields = {}
  for j = 1, 2 * n do fields[j] = ARGV[at + 1 + j] end
  at = at + 2 + 2 * n
  if redis.call('SET', KEYS[i], '1', 'NX') then
    local target = KEYS[1]
    if kind == 'd' then target = KEYS[2] end
    redis.call('XADD', target, '*', unpack(fields))
    appended = appended + 1
  end
end
return appended
"""


def entry_ms(entry_id: str | bytes) -> int:
    """The milliseconds part of a stream entry id (when Redis appended it)."""
    return int(_text(entry_id).split("-", 1)[0])


class RedisStreams:
    """The streams of one Redis server, as a source and as a sink."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 5.0) -> None:
        self.client = aioredis.Redis(
            host=host, port=port, socket_timeout=None, socket_connect_timeout=timeout_s, health_check_interval=30
        )
        self._write = self.client.register_script(_WRITE)

    async def close(self) -> None:
        await self.client.aclose()

    # ---- source --------------------------------------------------------------------------------
    async def ensure_group(self, stream: str, group: str) -> None:
        """The consumer group, created at the stream's start (every entry already in it is scored) if missing."""
        try:
            await self.client.xgroup_create(stream, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read(
        self, stream: str, group: str, consumer: str, count: int, block_ms: int | None, pending: bool = False
    ) -> list[Entry]:
        """New entries for ``consumer`` (waiting up to ``block_ms``), or with ``pending`` the ones already
        delivered to it and not acknowledged (what it held when its process died)."""
        reply = await self.client.xreadgroup(
            group, consumer, {stream: "0" if pending else ">"}, count=count, block=None if pending else block_ms
        )
        return [Entry(_text(i), f) for _, entries in reply or () for i, f in entries if f is not None]

    async def claim(self, stream: str, group: str, consumer: str, min_idle_ms: int, count: int) -> list[Entry]:
        """Entries other consumers of the group left pending for at least ``min_idle_ms``, now ``consumer``'s."""
        out: list[Entry] = []
        start = "0-0"
        while len(out) < count:
            reply = await self.client.xautoclaim(stream, group, consumer, min_idle_ms, start_id=start, count=count)
            start = _text(reply[0])
            out.extend(Entry(_text(i), f) for i, f in reply[1] if f is not None)
            deleted = reply[2] if len(reply) > 2 else []
            if deleted:  # trimmed away while pending: nothing left to score, so nothing to keep pending
                await self.client.xack(stream, group, *deleted)
            if start == "0-0":
                break
        return out

    async def ack(self, stream: str, group: str, ids: Sequence[str]) -> None:
        if ids:
            await self.client.xack(stream, group, *ids)

    async def lag(self, stream: str, group: str, now_ms: int) -> Lag:
        groups = await self.client.xinfo_groups(stream)
        info = next((g for g in groups if _text(g["name"]) == group), None)
        if info is None:
            return Lag(0, 0, 0.0)
        pending = int(info["pending"])
        unread = info.get("lag")
        last = _text(info["last-delivered-id"])
        if unread is None:  # Redis could not tell (entries deleted in between): count them
            unread = len(await self.client.xrange(stream, f"({last}", "+", count=100_000))
        oldest: int | None = None
        if pending:
            summary = await self.client.xpending(stream, group)
            if summary.get("min"):
                oldest = entry_ms(_text(summary["min"]))
        if unread:
            first = await self.client.xrange(stream, f"({last}", "+", count=1)
            if first:
                ms = entry_ms(_text(first[0][0]))
                oldest = ms if oldest is None else min(oldest, ms)
        age = max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0
        return Lag(int(unread), pending, age)

    # ---- sink ----------------------------------------------------------------------------------
    async def written(self, markers: Sequence[str]) -> set[str]:
        """The markers among ``markers`` that exist: their entries' outputs are already in the sink."""
        if not markers:
            return set()
        async with self.client.pipeline(transaction=False) as pipe:
            for marker in markers:
                pipe.exists(marker)
            found = await pipe.execute()
        return {m for m, hit in zip(markers, found) if hit}

    async def write(self, sink: str, dead_letter: str, outputs: Sequence[tuple[str, Output]]) -> int:
        """Append each (marker, output) whose marker does not exist yet, with its marker, atomically;
        returns how many were appended."""
        if not outputs:
            return 0
        keys = [sink, dead_letter, *(marker for marker, _ in outputs)]
        args: list[bytes | str | int] = []
        for _, output in outputs:
            args.extend(("d" if output.dead else "r", len(output.fields)))
            for key, value in output.fields.items():
                args.extend((key, value))
        return int(await self._write(keys=keys, args=args))

    async def settle(self, markers: Sequence[str]) -> None:
        """The entries are acknowledged: their markers expire after ``MARKER_TTL_S``."""
        if not markers:
            return
        async with self.client.pipeline(transaction=False) as pipe:
            for marker in markers:
                pipe.expire(marker, MARKER_TTL_S)
            await pipe.execute()


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
