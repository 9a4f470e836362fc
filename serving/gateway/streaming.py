"""Stream inputs in the gateway: the leader runs a consumer per stream input of every live endpoint
(``serving.streams.consumer``), and each consumed event goes through the same door as an HTTP request: the
endpoint's traffic split, the served entity's dispatcher (admission, micro-batching, its replicas) and the
inference log, with the event's id as the request id.

``StreamSupervisor`` keeps the running consumers in step with the live endpoints' configs (started,
restarted with a changed config, stopped with their endpoint or when this gateway stops leading) and reads
each consumer group's lag every ``interval_s``: for the metrics and for the autoscaler (``backlog_per_s``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator, Sequence

import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.inference_log import InferenceLogWriter, InferenceRecord, utc_now
from serving.protocol.errors import ApiError, error_body
from serving.protocol.events import EVENT_CONTENT_TYPE
from serving.protocol.wire import WireAnswer, WireRequest
from serving.streams.broker import Entry, Output, RedisStreams
from serving.streams.config import StreamInput
from serving.streams.consumer import StreamConsumer
from serving.traffic.router import choose_entity

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({429, 503, 504})  # no capacity now: the event is scored again, never dead-lettered


class StreamFrontDoor:
    """Scores an endpoint's stream events as its HTTP requests are scored (see the module docstring)."""

    def __init__(
        self,
        manager: EndpointManager,
        endpoint: str,
        inference_log: InferenceLogWriter,
        rng: random.Random | None = None,
    ) -> None:
        self.manager = manager
        self.endpoint = endpoint
        self.inference_log = inference_log
        self.rng = rng or random.Random()

    async def score(self, entries: Sequence[Entry]) -> list[Output | None]:
        """Each entry's output: the entries are split by the traffic split, and each served entity's share
        enters its dispatcher's queue at once (``Dispatcher.submit_many``), to leave in full envelopes."""
        live = self.manager.live.get(self.endpoint)
        if live is None:
            return [None] * len(entries)
        started = time.perf_counter()
        out: list[Output | None] = [None] * len(entries)
        shares: dict[str, list[tuple[int, Entry, dict[str, str]]]] = {}
        for at, entry in enumerate(entries):
            try:
                fields = {k.decode(): v.decode() for k, v in entry.fields.items()}
            except UnicodeDecodeError:
                out[at] = _dead(entry, "MALFORMED_REQUEST: event fields must be UTF-8 text")
                continue
            shares.setdefault(choose_entity(live.weights, self.rng), []).append((at, entry, fields))
        await asyncio.gather(*(self._share(live, name, share, out, started) for name, share in shares.items()))
        return out

    async def _share(
        self,
        live: LiveEndpoint,
        name: str,
        share: list[tuple[int, Entry, dict[str, str]]],
        out: list[Output | None],
        started: float,
    ) -> None:
        replica_set = live.replica_sets.get(name)
        if replica_set is None or replica_set.dispatcher is None:
            return  # not started yet: scored again after a back-off
        answers = await replica_set.dispatcher.submit_many(
            [WireRequest(entry.id, EVENT_CONTENT_TYPE, orjson.dumps(fields)) for _, entry, fields in share]
        )
        elapsed = time.perf_counter() - started
        for (at, entry, fields), answer in zip(share, answers):
            if isinstance(answer, ApiError):
                answer = WireAnswer(answer.status_code, 0, orjson.dumps(error_body(answer)), b"")
            if not isinstance(answer, WireAnswer) or answer.status in RETRY_STATUSES:
                continue  # no capacity now (AdmissionRefused, 429, 503, 504): scored again after a back-off
            self._record(entry, fields, name, replica_set.version, answer, elapsed)
            out[at] = (
                _dead(entry, _reason(answer.first))
                if answer.status != 200
                else Output(
                    entry.id,
                    {
                        b"event_id": entry.id.encode(),
                        b"prediction": _one_prediction(answer.first),
                        b"model_version": replica_set.version.encode(),
                        b"served_entity": name.encode(),
                    },
                )
            )

    def _record(
        self, entry: Entry, fields: dict[str, str], entity: str, version: str, answer: WireAnswer, elapsed: float
    ) -> None:
        ok = answer.status == 200
        self.inference_log.record(
            InferenceRecord(
                request_id=entry.id,
                timestamp=utc_now(),
                endpoint=self.endpoint,
                served_entity=entity,
                model_version=version,
                status_code=answer.status,
                latency_ms=elapsed * 1000,
                inputs=logged_inputs(fields),
                served_features=answer.second.decode() if ok and answer.second else None,
                outputs=answer.first.decode() if ok else None,
                error_code=None if ok else _code(answer.first),
                rows=answer.rows if ok else 0,
            )
        )


def logged_inputs(fields: dict[str, str]) -> str:
    """An event as the inference log keeps requests (``dataframe_records``, one row), so the skew and
    parity flows read it like HTTP traffic: a field whose text is a JSON number is logged as that number
    (the replica parsed it by the model's types), any other as its text."""
    row = {}
    for key, value in fields.items():
        try:
            number = orjson.loads(value)
            row[key] = number if isinstance(number, (int, float)) and not isinstance(number, bool) else value
        except orjson.JSONDecodeError:
            row[key] = value
    return orjson.dumps({"dataframe_records": [row]}).decode()


def _one_prediction(first: bytes) -> bytes:
    """The event's prediction: the one element of the replica's one-row answer, as JSON."""
    value = orjson.loads(first)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    return orjson.dumps(value)


def _error(first: bytes) -> dict:
    try:
        body = orjson.loads(first)
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(first: bytes) -> str:
    return str(_error(first).get("error_code", "INTERNAL_ERROR"))


def _reason(first: bytes) -> str:
    body = _error(first)
    return f"{body.get('error_code', 'INTERNAL_ERROR')}: {body.get('message', 'the model failed on this event')}"[:500]


def _dead(entry: Entry, reason: str) -> Output:
    """A dead letter: the original fields, then ``event_id`` and ``reason`` (they win over fields of the same name)."""
    return Output(entry.id, {**entry.fields, b"event_id": entry.id.encode(), b"reason": reason.encode()}, dead=True)


class StreamSupervisor:
    """The consumers of this gateway's stream inputs; the leader's only (see the module docstring)."""

    def __init__(
        self,
        manager: EndpointManager,
        inference_log: InferenceLogWriter,
        *,
        interval_s: float = 1.0,
        claim_idle_s: float = 30.0,
        consumer: str | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.manager = manager
        self.inference_log = inference_log
        self.interval_s = interval_s
        self.claim_idle_s = claim_idle_s
        self.consumer = consumer or socket.gethostname()  # stable across restarts: a restart reads its own pending
        self.wall = wall
        self.consumers: dict[tuple[str, str, str], tuple[StreamInput, StreamConsumer, asyncio.Task[None]]] = {}
        self._brokers: dict[tuple[str, int], RedisStreams] = {}

    async def run(self) -> None:
        try:
            while True:
                try:
                    self.sync()
                    await self.read_lag()
                except Exception:  # the loop must outlive a bad turn: the consumers run on meanwhile
                    log.exception("stream supervisor step failed")
                await asyncio.sleep(self.interval_s)
        finally:
            await self.stop()

    def sync(self) -> None:
        """Start the consumers the live configs ask for; stop those they no longer do."""
        wanted: dict[tuple[str, str, str], StreamInput] = {}
        if self.manager.leading:
            for endpoint, live in self.manager.live.items():
                for stream in live.streams:
                    wanted[(endpoint, stream.source_address.url, stream.group)] = stream
        for key, (config, _, task) in list(self.consumers.items()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error(
                    "the consumer of %s for endpoint %s stopped (%r); starting it again",
                    key[1],
                    key[0],
                    task.exception(),
                )
            if wanted.get(key) != config or task.done():
                task.cancel()
                del self.consumers[key]
        for key, config in wanted.items():
            if key not in self.consumers:
                self.consumers[key] = self._start(key[0], config)

    def _start(self, endpoint: str, config: StreamInput) -> tuple[StreamInput, StreamConsumer, asyncio.Task[None]]:
        door = StreamFrontDoor(self.manager, endpoint, self.inference_log)
        consumer = StreamConsumer(
            endpoint,
            config,
            self._broker(config.source_address.server),
            self._broker(config.sink_address.server),
            door.score,
            consumer=self.consumer,
            claim_idle_s=self.claim_idle_s,
        )
        log.info("endpoint %s: consuming %s (group %s)", endpoint, config.source_address.url, config.group)
        return config, consumer, asyncio.get_running_loop().create_task(consumer.run())

    def _broker(self, server: tuple[str, int]) -> RedisStreams:
        if server not in self._brokers:
            self._brokers[server] = RedisStreams(*server)
        return self._brokers[server]

    async def read_lag(self) -> None:
        now_ms = int(self.wall() * 1000)
        for _, consumer, _ in list(self.consumers.values()):
            try:
                await consumer.lag(now_ms)
            except Exception as exc:  # the broker is away: the consumer says so, the lag keeps its last reading
                log.debug("lag of %s unreadable: %s", consumer.name, type(exc).__name__)

    async def stop(self) -> None:
        tasks = [task for _, _, task in self.consumers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.consumers.clear()
        brokers, self._brokers = list(self._brokers.values()), {}
        for broker in brokers:
            await broker.close()

    def backlog_per_s(self, endpoint: str, entity: str) -> float:
        """The autoscaler's stream signal for a served entity: its traffic share of each of its endpoint's
        consumer groups' unread entries (those in flight are being served) divided by that stream's
        ``max_lag_s``; the largest."""
        live = self.manager.live.get(endpoint)
        if live is None:
            return 0.0
        share = dict(live.weights).get(entity, 0) / 100
        return max(
            (
                share * consumer.stats.lag.unread / config.max_lag_s
                for (name, _, _), (config, consumer, _) in self.consumers.items()
                if name == endpoint
            ),
            default=0.0,
        )

    def collector(self) -> Collector:
        return _StreamCollector(self)


class _StreamCollector(Collector):
    def __init__(self, supervisor: StreamSupervisor) -> None:
        self.supervisor = supervisor

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["endpoint", "stream", "group"]
        events = CounterMetricFamily(
            "tollfree_stream_events",
            "Stream events by outcome (result, dead_letter, "
            "duplicate: already in the sink when delivered again; retry: scored again).",
            labels=[*labels, "outcome"],
        )
        lag = GaugeMetricFamily(
            "tollfree_stream_lag_entries",
            "Entries of the consumer group not yet acknowledged (not yet read, or read and in flight).",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "tollfree_stream_oldest_age_seconds", "Age of the oldest entry not yet acknowledged.", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "tollfree_stream_in_flight_events", "Events being scored by this gateway.", labels=labels
        )
        for (endpoint, url, group), (_, consumer, _) in list(self.supervisor.consumers.items()):
            key = [endpoint, url, group]
            stats = consumer.stats
            for outcome, value in (
                ("result", stats.results),
                ("dead_letter", stats.dead_letters),
                ("duplicate", stats.duplicates),
                ("retry", stats.retries),
            ):
                events.add_metric([*key, outcome], value)
            lag.add_metric(key, stats.lag.entries)
            age.add_metric(key, stats.lag.oldest_age_s)
            in_flight.add_metric(key, stats.in_flight)
        yield from (events, lag, age, in_flight)
