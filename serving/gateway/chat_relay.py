"""Relaying a chat answer to the client: the stream event by event, guardrails on what goes in and out, and
what the request's inference-log record and metrics need (``Outcome``).

The stream's events are re-framed as they complete (``serving.generative.sse``): text chunks go on at once
(time to first token and the gap between tokens observed here, at the gateway), the usage chunk the
gateway always asks for goes on only if the client asked for it, and ``[DONE]`` ends it. A client that
disconnects cancels the relay; the caller then closes the upstream response, which drops the connection
to the replica or external server, and that stops the generation there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from serving.gateway.metrics import GatewayMetrics
from serving.gateway.upstream import Target, chunks
from serving.generative import redact, sse
from serving.generative.ai_gateway import AiGatewayConfig
from serving.generative.chat import ChatRequest, delta_text, estimate_tokens, message_text, usage_of
from serving.protocol.errors import REQUEST_ID_HEADER, invalid_parameter

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """What became of one chat request, for its record and metrics."""

    started: float  # perf_counter at arrival
    status: int = 200
    error_code: str | None = None
    entity: str | None = None
    version: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    cached: bool = False
    started_response: bool = False  # headers sent: errors now go in the stream


async def send_json(
    send: Any, status: int, body: bytes, request_id: str, headers: Mapping[str, str] | None = None
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (REQUEST_ID_HEADER.encode(), request_id.encode()),
                *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def guard_input(request: ChatRequest, ai: AiGatewayConfig) -> ChatRequest:
    """The input PII guardrail: BLOCK refuses a request whose messages carry a card number or an e-mail
    address (400 naming the kind, not the value); MASK replaces each with ``[REDACTED:<kind>]`` before
    the model sees it."""
    if ai.input_pii == "NONE":
        return request
    found = sorted({kind for m in request.messages for kind in redact.find(message_text(m))})
    if not found:
        return request
    if ai.input_pii == "BLOCK":
        raise invalid_parameter(f"messages: the endpoint's guardrail blocks personal data ({', '.join(found)})")
    return request.with_messages(
        tuple(
            {**m, "content": redact.redact(m["content"])} if isinstance(m.get("content"), str) else m
            for m in request.messages
        )
    )


def guard_output(body: bytes, ai: AiGatewayConfig) -> bytes:
    """The output PII guardrail on a whole answer: BLOCK answers 400 instead, MASK redacts the text."""
    if ai.output_pii == "NONE":
        return body
    try:
        answer = orjson.loads(body)
        message = answer["choices"][0]["message"]
        text = message_text(message)
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return body
    if not redact.find(text):
        return body
    if ai.output_pii == "BLOCK":
        raise invalid_parameter("the model's answer carried personal data and the endpoint's guardrail blocks it")
    message["content"] = redact.redact(text)
    return orjson.dumps(answer)


async def relay_stream(
    receive: Any,
    send: Any,
    response: aiohttp.ClientResponse,
    target: Target,
    request: ChatRequest,
    request_id: str,
    outcome: Outcome,
    metrics: GatewayMetrics,
    endpoint: str,
) -> None:
    """Relay the upstream's events until ``[DONE]``, an error, or the client leaving (which cancels it)."""
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", sse.CONTENT_TYPE.encode()),
                (b"cache-control", b"no-cache"),
                (REQUEST_ID_HEADER.encode(), request_id.encode()),
                (b"served-model-name", target.entity.encode()),
            ],
        }
    )
    outcome.started_response = True
    gauge = metrics.streams.labels(endpoint, target.entity)
    gauge.inc()
    relay = asyncio.ensure_future(_relay(send, response, target, request, outcome, metrics, endpoint))
    watcher = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not relay.done():  # the client went away: stop relaying (the caller closes the upstream)
            relay.cancel()
            outcome.status, outcome.error_code = 499, "CLIENT_CLOSED_REQUEST"
        await asyncio.gather(relay, return_exceptions=True)
    finally:
        watcher.cancel()
        gauge.dec()


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _relay(
    send: Any,
    response: aiohttp.ClientResponse,
    target: Target,
    request: ChatRequest,
    outcome: Outcome,
    metrics: GatewayMetrics,
    endpoint: str,
) -> None:
    splitter = sse.SseSplitter()
    clock = _TokenClock(outcome.started, metrics, endpoint, target.entity)
    try:
        await _pass_on(send, response, target, request, outcome, splitter, clock)
    finally:  # also when the client left: what was generated is charged
        outcome.prompt_tokens, outcome.completion_tokens = clock.reported or (request.prompt_tokens(), clock.tokens)
        clock.finish()


async def _pass_on(
    send: Any,
    response: aiohttp.ClientResponse,
    target: Target,
    request: ChatRequest,
    outcome: Outcome,
    splitter: sse.SseSplitter,
    clock: _TokenClock,
) -> None:
    done = False
    try:
        async for piece in chunks(response):
            out = []
            for data in splitter.feed(piece):
                if data == sse.DONE:
                    done = True
                    out.append(sse.DONE_EVENT)
                    break
                event, usage, failed = _read_event(data, outcome, clock)
                clock.reported = usage or clock.reported
                if failed:
                    outcome.status, outcome.error_code = 502, "UPSTREAM_ERROR"
                if event is not None and (usage is None or request.include_usage):
                    out.append(sse.event(data))
            if out:
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if done:
                break
    except (TimeoutError, aiohttp.ClientError, OSError, sse.SseError) as exc:
        log.warning("stream from served entity %s broke off: %s", target.entity, type(exc).__name__)
    if not done and outcome.status == 200:
        outcome.status, outcome.error_code = 502, "TEMPORARILY_UNAVAILABLE"
        await send(
            {
                "type": "http.response.body",
                "more_body": True,
                "body": sse.error_event(
                    "TEMPORARILY_UNAVAILABLE", f"served entity {target.entity}: the answer broke off before its end"
                ),
            }
        )
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _read_event(data: bytes, outcome: Outcome, clock: _TokenClock) -> tuple[bytes | None, tuple[int, int] | None, bool]:
    """(the event to pass on or None, the usage it reports, whether it is an error event)."""
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data, None, False
    if not isinstance(chunk, dict):
        return data, None, False
    if "error" in chunk:
        return data, None, True
    usage = usage_of(chunk) if not chunk.get("choices") else None
    text = delta_text(chunk)
    if text:
        outcome.text.append(text)
        clock.token(max(1, estimate_tokens(text)))
    return data, usage, False


class _TokenClock:
    """Time to first token and the gaps between tokens, observed as the gateway passes them on."""

    def __init__(self, started: float, metrics: GatewayMetrics, endpoint: str, entity: str) -> None:
        self.started = started
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.reported: tuple[int, int] | None = None  # the usage the upstream reported, if it did
        self._ttft = metrics.time_to_first_token.labels(endpoint, entity)
        self._itl = metrics.inter_token.labels(endpoint, entity)
        self._rate = metrics.output_tokens_per_s.labels(endpoint, entity)

    def token(self, n: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
            self._ttft.observe(now - self.started)
        elif self.last is not None:
            self._itl.observe(now - self.last)
        self.last = now
        self.tokens += n

    def finish(self) -> None:
        if self.first is not None and self.last is not None and self.last > self.first:
            self._rate.observe(self.tokens / (self.last - self.first))
