"""The data plane: ``POST /serving-endpoints/{name}/invocations``, as a plain ASGI handler.

This is the hot path, so it stays off FastAPI's routing and request objects and never parses the
payload: it checks the token and the size, picks the served entity by the traffic split, hands the
raw body to the entity's dispatcher (which batches it with its neighbours to a replica) and sends the
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
from typing import Any

import orjson

from serving.endpoints.manager import EndpointManager
from serving.gateway.auth import TokenRegistry, authenticate, authorize
from serving.gateway.chat_plane import ChatPlane
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.rate_limit import TokenBuckets
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
from serving.traffic.dispatcher import AdmissionRefused
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
        tokens: TokenRegistry,
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

    async def __call__(self, scope: dict, receive: Any, send: Any, name: str) -> None:
        started = time.perf_counter()
        headers = dict(scope["headers"])
        request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)
        entity_name: str | None = None
        version: str | None = None
        body = b""
        answer: WireAnswer | None = None
        extra: list[tuple[bytes, bytes]] = []
        in_flight = self.metrics.in_flight.labels(name)
        in_flight.inc()
        try:
            who = authorize(self.tokens, headers.get(b"authorization", b"").decode("latin-1") or None, name)
            self.limiter.admit(who.name, who.rate_limit)
            declared = headers.get(b"content-length", b"")
            if declared.isdigit() and int(declared) > self.max_body_bytes:
                raise payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
            body = await self._body(receive)
            chat = is_chat_body(body) if self.chat is not None else None
            if chat is not None:
                await self.chat.handle(receive, send, name, who, chat, request_id, started)  # type: ignore[union-attr]
                return
            live = self.manager.live.get(name) or await self.manager.served(name)
            entity_name = choose_entity(live.weights, self.rng)
            entity = live.entities.get(entity_name)
            if entity is None:  # an external chat model: what the chat parser says is wrong with the body
                parse_chat_request(body)
                raise invalid_parameter(
                    f"served entity {entity_name} is an external chat model: send a chat request (messages)"
                )
            version = entity.version
            if entity.dispatcher is None:
                raise unavailable(f"served entity {entity_name} is not ready yet")
            content_type = headers.get(b"content-type", b"").decode("latin-1")
            cache_key = None
            if live.cache is not None and content_type.split(";")[0].strip().lower() == "application/json":
                try:
                    cache_key = (entity_name, version, canonical_payload_key(body))
                except ApiError:
                    cache_key = None  # not JSON: the replica answers with the precise error
            answer = live.cache.get(cache_key) if cache_key is not None else None
            if answer is not None:
                self.metrics.cache_hits.labels(name).inc()
                extra.append((CACHE_HEADER.encode(), b"hit"))
            else:
                try:
                    answer = await entity.dispatcher.submit(WireRequest(request_id, content_type, body))
                except AdmissionRefused as refused:
                    raise ApiError(
                        429,
                        "REQUEST_LIMIT_EXCEEDED",
                        f"endpoint {name} is at capacity ({refused.reason}); retry shortly",
                        headers={"Retry-After": str(refused.retry_after_s)},
                    ) from refused
                if cache_key is not None and answer.status == 200:
                    live.cache.put(cache_key, answer)  # type: ignore[union-attr]
                if live.cache is not None:
                    extra.append((CACHE_HEADER.encode(), b"miss"))
            status, out = answer.status, answer.client_body()
            error_code = None if status == 200 else _error_code(answer.first)
            extra.append((SERVED_MODEL_HEADER.encode(), entity_name.encode()))
        except ApiError as err:
            status, error_code = err.status_code, err.error_code
            out = orjson.dumps(error_body(err))
            extra.extend((k.lower().encode(), v.encode()) for k, v in err.headers.items())
            answer = None
        finally:
            in_flight.dec()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(out)).encode()),
                    (_REQUEST_ID, request_id.encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})
        elapsed = time.perf_counter() - started
        self.metrics.requests.labels(name, entity_name or "", str(status)).inc()
        self.metrics.latency.labels(name, entity_name or "").observe(elapsed)
        ok = answer is not None and answer.status == 200
        self.inference_log.record(
            InferenceRecord(
                request_id=request_id,
                timestamp=utc_now(),
                endpoint=name,
                served_entity=entity_name,
                model_version=version,
                status_code=status,
                latency_ms=elapsed * 1000,
                inputs=body.decode("utf-8", "replace") if body else None,
                served_features=answer.second.decode() if ok and answer.second else None,  # type: ignore[union-attr]
                outputs=answer.first.decode() if ok else None,  # type: ignore[union-attr]
                error_code=error_code,
                rows=answer.rows if ok else 0,  # type: ignore[union-attr]
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
            body = await self._body(receive)
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
            out = orjson.dumps(error_body(err))
            await send(
                {
                    "type": "http.response.start",
                    "status": err.status_code,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(out)).encode()),
                        (_REQUEST_ID, request_id.encode()),
                        *((k.lower().encode(), v.encode()) for k, v in err.headers.items()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": out})
            return
        await self.chat.handle(receive, send, model, who, data, request_id, started, openai=True)

    async def _body(self, receive: Any) -> bytes:
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


def _error_code(error_json: bytes) -> str:
    try:
        return str(orjson.loads(error_json).get("error_code", "INTERNAL_ERROR"))
    except (orjson.JSONDecodeError, AttributeError):
        return "INTERNAL_ERROR"
