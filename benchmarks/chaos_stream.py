"""The chaos soak's stream: events appended to the stack's redis-server at a steady rate, the id of each kept, then
the endpoint's outputs counted against them: lost (an event never scored) and doubled (an event with more than one
output, in the sink and the dead-letter stream together).

An event's id is the entry id the broker gave it (unique in its stream); the gateway writes it as ``event_id`` in
the event's result or dead letter.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT, FieldT

SOURCE, SINK, DEAD, GROUP = "chaos-tx", "chaos-scores", "chaos-dead", "chaos"
CHUNK = 10_000
Entries = list[tuple[bytes, dict[bytes, bytes]]]  # what XRANGE answers: (entry id, fields)
SETTLE_S = 10.0  # outputs are read this long after the last event had one: a second output may come later


def stream_input(redis_url: str) -> dict[str, Any]:
    """The endpoint config's stream input on the broker at ``redis_url``."""
    return {
        "source": f"{redis_url}/{SOURCE}",
        "sink": f"{redis_url}/{SINK}",
        "dead_letter": f"{redis_url}/{DEAD}",
        "group": GROUP,
    }


class Producer:
    """Appends ``events`` (in turn, looping) to the source at ``rate`` a second from a thread of its own, until
    ``stop``; ``ids`` holds the id of every event appended. An append the broker refuses is counted and its events
    are sent again at the next tick, so the pace catches up."""

    def __init__(self, client: redis.Redis, events: Sequence[dict[FieldT, EncodableT]], rate: float) -> None:
        self.client, self.events, self.rate = client, events, rate
        self.ids: list[str] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self.rate) - len(self.ids)
            if due > 0:
                pipe = self.client.pipeline(transaction=False)
                for i in range(len(self.ids), len(self.ids) + due):
                    pipe.xadd(SOURCE, self.events[i % len(self.events)])
                try:
                    self.ids.extend(i.decode() for i in pipe.execute())
                except redis.RedisError:
                    self.errors += 1
            self._stop.wait(min(0.1, 1 / self.rate))


class Tail:
    """A stream read on from where the last call stopped: each poll reads only the entries appended since."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client, self.stream, self.after = client, stream, "-"

    def event_ids(self) -> list[str]:
        out: list[str] = []
        while True:
            chunk = cast(Entries, self.client.xrange(self.stream, self.after, "+", count=CHUNK))
            out.extend(fields[b"event_id"].decode() for _, fields in chunk)
            if chunk:
                self.after = "(" + chunk[-1][0].decode()
            if len(chunk) < CHUNK:
                return out


@dataclass(frozen=True)
class StreamFigures:
    produced: int
    scored: int  # distinct events with a result in the sink
    dead_letters: int  # distinct events in the dead-letter stream (each is also lost: it was not scored)
    lost: int  # produced, never scored
    doubled: int  # more than one output
    append_errors: int
    drained_s: float  # from the end of the load until every event had an output (or the wait gave up)


def count(
    produced: Sequence[str],
    results: collections.Counter[str],
    dead: collections.Counter[str],
    append_errors: int,
    drained_s: float,
) -> StreamFigures:
    """The figures from the produced ids and each id's number of outputs in the sink and the dead-letter stream."""
    ids = set(produced)
    outputs = results + dead
    return StreamFigures(
        produced=len(ids),
        scored=len(ids & set(results)),
        dead_letters=len(ids & set(dead)),
        lost=len(ids - set(results)),
        doubled=sum(1 for i in ids if outputs[i] > 1),
        append_errors=append_errors,
        drained_s=round(drained_s, 1),
    )


def drain_and_count(client: redis.Redis, producer: Producer, timeout_s: float) -> StreamFigures:
    """Waits until every produced event has an output (up to ``timeout_s``: a consumer that died leaves its
    entries to be claimed after the claim idle time), reads on for ``SETTLE_S``, then counts."""
    began = time.monotonic()
    ids = set(producer.ids)
    results: collections.Counter[str] = collections.Counter()
    dead: collections.Counter[str] = collections.Counter()
    tails = (Tail(client, SINK), Tail(client, DEAD))
    while True:
        results.update(tails[0].event_ids())
        dead.update(tails[1].event_ids())
        if ids <= set(results) | set(dead) or time.monotonic() - began > timeout_s:
            break
        time.sleep(1.0)
    drained = time.monotonic() - began
    time.sleep(SETTLE_S)
    results.update(tails[0].event_ids())
    dead.update(tails[1].event_ids())
    return count(producer.ids, results, dead, producer.errors, drained)
