"""The data plane: ``POST /serving-endpoints/{name}/invocations``, as a plain ASGI handler.

This is the hot path, so it stays off FastAPI's routing and request objects and never parses the
payload: it checks the token and the size, picks the served entity by the traffic split, hands the
raw body to its replica set's dispatcher (which batches it with its neighbours to a replica) and sends the
replica's answer back byte for byte. The replica checks the payload and names what is wrong. A body with
``messages`` goes to the chat plane instead; any other body sent to a chat model's replica comes back as the
chat parser's 400 naming the field (``ChatReplicaApp``), as the OpenAI-compatible route answers it. Every
request, refused ones included, leaves one inference-log record.
"""

from __future__ import annotations

import logging
import random
import re
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.gateway.auth import Principal, Tokens, authenticate, authorize
from serving.gateway.chat_plane import ChatPlane
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.rate_limit import TokenBuckets
from serving.gateway.shadow import ShadowMirror
from serving.generative.chat import is_chat_body, parse_chat_request
from serving.inference_log import InferenceLogWriter, InferenceRecord, utc_now
from serving.protocol.errors import (
    REQUEST_ID_HEADER,
    ApiError,
    error_body,
    invalid_parameter,
    payload_too_large,
    permission_denied,
    resolve_request_id,
    unavailable,
)
from serving.protocol.scoring import canonical_payload_key
from serving.protocol.wire import WireAnswer, WireRequest
from serving.traffic.dispatcher import AdmissionRefused, Dispatcher
from serving.traffic.router import choose_entity

log = logging.getLogger(__name__)

INVOCATIONS = re.compile(r"^/serving-endpoints/([^/]+)/invocations$")
SERVED_MODEL_HEADER = "served-model-name"
CACHE_HEADER = "x-tollfree-cache"
_REQUEST_ID = REQUEST_ID_HEADER.encode()


class InvocationsHandler:
    def __init__(
        self,
        manager: EndpointManager,
        tokens: Tokens,
        inference_log: InferenceLogWriter,
        metrics: GatewayMetrics,
        *,
        rng: random.Random | None = None,
        max_body_bytes: int = 4 * 1024 * 1024,
        limiter: TokenBuckets | None = None,
        chat: ChatPlane | None = None,
    ) -> None:
        self.manager = manager
        self.tokens = tokens
        self.inference_log = inference_log
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.max_body_bytes = max_body_bytes
        self.limiter = limiter or TokenBuckets()
        self.chat = chat
        self.shadows = ShadowMirror(self.score_on_entity, Reply, inference_log, metrics, self.rng)

    async def __call__(self, scope: dict, receive: Any, send: Any, name: str) -> None:
        """One invocation of endpoint ``name``: admitted, scored (or handed to the chat plane, which answers and
        logs it), answered, logged."""
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)
        reply = Reply()
        in_flight = self.metrics.in_flight.labels(name)
        in_flight.inc()
        try:
            who = self.admit(headers, name)
            reply.request_body = body = await self.body(receive)
            chat = is_chat_body(body) if self.chat is not None else None
            if self.chat is not None and chat is not None:
                await self.chat.handle(receive, send, name, who, chat, request_id, started)
                return
            await self._score(name, headers, body, request_id, reply)
        except ApiError as err:
            reply.refused(err)
        finally:
            in_flight.dec()
        await send_body(send, reply.status, reply.body, [(_REQUEST_ID, request_id.encode()), *reply.headers])
        self.record(name, request_id, reply, time.perf_counter() - started)
        if reply.scored is not None and reply.answer is not None:  # a request the split's entity answered
            self.shadows.mirror(*reply.scored, reply.served_entity)

    def admit(self, headers: dict[bytes, bytes], name: str) -> Principal:
        """The caller, allowed on endpoint ``name`` and within its rate limit, with a body not declared too big."""
        who = authorize(self.tokens, headers.get(b"authorization", b"").decode("latin-1") or None, name)
        self.limiter.admit(who.name, who.rate_limit)
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_body_bytes:
            raise payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
        return who

    async def _score(self, name: str, headers: dict[bytes, bytes], body: bytes, request_id: str, reply: Reply) -> None:
        """Route ``body`` to a served entity by the traffic split and fill ``reply`` with its answer. A request
        refused (429, 503) by a served entity that left the routing while the request waited there (a config
        change replaced it and its replicas stopped) is routed once more, by the endpoint's new routing."""
        request = WireRequest(request_id, headers.get(b"content-type", b"").decode("latin-1"), body)
        for last in (False, True):
            live = self.manager.live.get(name) or await self.manager.served(name)
            try:
                await self._score_on(live, name, request, reply)
                return
            except ApiError as err:
                current = self.manager.live.get(name)
                gone = current is not None and current.replica_sets.get(reply.served_entity or "") is not (
                    live.replica_sets.get(reply.served_entity or "")
                )
                if last or err.status_code not in (429, 503) or not gone:
                    raise

    async def _score_on(self, live: LiveEndpoint, name: str, request: WireRequest, reply: Reply) -> None:
        await self.score_on_entity(live, name, choose_entity(live.weights, self.rng), request, reply)

    async def score_on_entity(
        self, live: LiveEndpoint, name: str, served_entity: str, request: WireRequest, reply: Reply
    ) -> None:
        """Fill ``reply`` with ``served_entity``'s answer to ``request``: from the response cache, or through its
        replica set's dispatcher."""
        reply.served_entity = served_entity
        reply.scored = (live, name, request)
        replica_set = live.replica_sets.get(served_entity)
        if replica_set is None:  # an external chat model: what the chat parser says is wrong with the body
            parse_chat_request(request.body)
            raise invalid_parameter(
                f"served entity {served_entity} is an external chat model: send a chat request (messages)"
            )
        reply.version = replica_set.version
        dispatcher = replica_set.dispatcher
        if dispatcher is None:
            raise unavailable(f"served entity {served_entity} is not ready yet")
        key = _cache_key(served_entity, replica_set.version, request) if live.cache is not None else None
        answer = live.cache.get(key) if live.cache is not None and key is not None else None
        if answer is not None:
            self.metrics.cache_hits.labels(name).inc()
            reply.headers.append((CACHE_HEADER.encode(), b"hit"))
        else:
            answer = await _submit(dispatcher, request, name)
            if live.cache is not None:
                if key is not None and answer.status == 200:
                    live.cache.put(key, answer)
                reply.headers.append((CACHE_HEADER.encode(), b"miss"))
        reply.answered(answer)

    def record(self, name: str, request_id: str, reply: Reply, elapsed: float) -> None:
        """The request's metrics and its inference-log record."""
        self.metrics.requests.labels(name, reply.served_entity or "", str(reply.status)).inc()
        self.metrics.latency.labels(name, reply.served_entity or "").observe(elapsed)
        answer = reply.answer if reply.answer is not None and reply.answer.status == 200 else None
        self.inference_log.record(
            InferenceRecord(
                request_id=request_id,
                timestamp=utc_now(),
                endpoint=name,
                served_entity=reply.served_entity,
                model_version=reply.version,
                status_code=reply.status,
                latency_ms=elapsed * 1000,
                inputs=reply.request_body.decode("utf-8", "replace") if reply.request_body else None,
                served_features=answer.second.decode() if answer is not None and answer.second else None,
                outputs=answer.first.decode() if answer is not None else None,
                error_code=reply.error_code,
                rows=answer.rows if answer is not None else 0,
            )
        )

    async def openai(self, scope: dict, receive: Any, send: Any) -> None:
        """``POST /serving-endpoints/chat/completions``: a chat request whose ``model`` names the endpoint. A request
        refused before that endpoint is known (no valid token, no ``model``, a token not allowed on it) gets its
        error and leaves no inference-log record; from the chat plane on, every request leaves one."""
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)
        try:
            header = headers.get(b"authorization", b"").decode("latin-1") or None
            who = authenticate(self.tokens, header)
            self.limiter.admit(who.name, who.rate_limit)
            body = await self.body(receive)
            data = is_chat_body(body)
            if data is None and self.chat is not None:  # what the chat parser says is wrong with it, by name
                parse_chat_request(body, require_model=True)
            if data is None or self.chat is None:
                raise invalid_parameter("the body must be a JSON chat request with model and messages")
            model = data.get("model")
            if not isinstance(model, str) or not model:
                raise invalid_parameter("model is required: the name of the serving endpoint")
            if not who.can_access(model):
                raise permission_denied(f"token {who.name!r} may not access serving endpoint {model[:100]!r}")
        except ApiError as err:
            headers_out = [(_REQUEST_ID, request_id.encode()), *error_headers(err)]
            await send_body(send, err.status_code, orjson.dumps(error_body(err)), headers_out)
            return
        await self.chat.handle(receive, send, model, who, data, request_id, started, openai=True)

    async def body(self, receive: Any) -> bytes:
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ApiError(400, "MALFORMED_REQUEST", "the client went away before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)


@dataclass
class Reply:
    """What one invocation answers, and what its inference-log record says about it."""

    status: int = 500
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    error_code: str | None = None
    request_body: bytes = b""
    served_entity: str | None = None  # the name the traffic split chose
    version: str | None = None  # its model version
    answer: WireAnswer | None = None  # the replica's (or the cache's) answer; None when refused
    scored: tuple[LiveEndpoint, str, WireRequest] | None = None  # what was sent to be scored, for the shadows

    def answered(self, answer: WireAnswer) -> None:
        """The answer goes back byte for byte, naming the served entity that gave it."""
        self.answer, self.status, self.body = answer, answer.status, answer.client_body()
        self.error_code = None if answer.status == 200 else _error_code(answer.first)
        self.headers.append((SERVED_MODEL_HEADER.encode(), str(self.served_entity).encode()))

    def refused(self, err: ApiError) -> None:
        self.answer, self.status, self.body, self.error_code = (
            None,
            err.status_code,
            orjson.dumps(error_body(err)),
            err.error_code,
        )
        self.headers.extend(error_headers(err))


def _cache_key(served_entity: str, version: str, request: WireRequest) -> tuple[str, ...] | None:
    """The response cache's key for a JSON request: the same payload to the same model version. None for any
    other body (the replica answers with the precise error)."""
    if request.content_type.split(";")[0].strip().lower() != "application/json":
        return None
    try:
        return served_entity, version, canonical_payload_key(request.body)
    except ApiError:
        return None


async def _submit(dispatcher: Dispatcher, request: WireRequest, endpoint: str) -> WireAnswer:
    """The replica's answer through the served entity's dispatcher; 429 when it refuses the request."""
    try:
        return await dispatcher.submit(request)
    except AdmissionRefused as refused:
        raise ApiError(
            429,
            "REQUEST_LIMIT_EXCEEDED",
            f"endpoint {endpoint} is at capacity ({refused.reason}); retry shortly",
            headers={"Retry-After": str(refused.retry_after_s)},
        ) from refused


def error_headers(err: ApiError) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]


async def send_body(
    send: Any, status: int, body: bytes, headers: list[tuple[bytes, bytes]], content_type: bytes = b"application/json"
) -> None:
    """One whole answer: status, content type and length, ``headers``, ``body``."""
    start = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": body})


def _error_code(error_json: bytes) -> str:
    try:
        return str(orjson.loads(error_json).get("error_code", "INTERNAL_ERROR"))
    except (orjson.JSONDecodeError, AttributeError):
        return "INTERNAL_ERROR"
