"""The Open Inference Protocol's REST routes on every endpoint (``ROUTES``), as a plain ASGI handler beside the data
plane.

A model is an endpoint; a version pins the served entity that serves that model version (404 when none does),
else the traffic split picks one. An inference request becomes the MLflow route's request for the same rows
(``serving.protocol.oip``) and goes through the data plane's admission, cache, dispatcher and inference log; its
predictions come back as output tensors. Errors answer ``{"error": message}``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool

from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.endpoints.model_io import model_io
from serving.gateway.auth import Principal, Tokens, authenticate, authorize
from serving.gateway.data_plane import InvocationsHandler, Reply, error_headers, send_body
from serving.protocol import oip
from serving.protocol.columns import ModelIO
from serving.protocol.errors import (
    REQUEST_ID_HEADER,
    ApiError,
    invalid_parameter,
    not_found,
    resolve_request_id,
    unavailable,
)
from serving.protocol.wire import WireRequest
from serving.traffic.router import choose_entity

PREFIX = "/v2"
ANY, MODEL_TOKEN = "any token", "any token with a right to the endpoint"
ROUTES = (  # (method, path, who may call it, what it answers): the HTTP API reference lists these
    ("GET", "/v2/health/live", ANY, "the server is live"),
    ("GET", "/v2/health/ready", ANY, "the server is ready"),
    ("GET", "/v2", ANY, "server metadata: name, version, extensions"),
    ("GET", "/v2/models/{name}", MODEL_TOKEN, "model metadata: versions served, inputs and outputs"),
    ("GET", "/v2/models/{name}/versions/{version}", MODEL_TOKEN, "the metadata of the entity serving that version"),
    ("GET", "/v2/models/{name}/ready", MODEL_TOKEN, "200 when a replica is ready, else 400"),
    ("GET", "/v2/models/{name}/versions/{version}/ready", MODEL_TOKEN, "the same for that version"),
    ("POST", "/v2/models/{name}/infer", MODEL_TOKEN, "inference: input tensors in, output tensors out"),
    ("POST", "/v2/models/{name}/versions/{version}/infer", MODEL_TOKEN, "inference by the entity serving that version"),
)
MODEL = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?(?:/(ready|infer))?$")
SERVER_NAME = "tollfree"
EXTENSIONS = ["binary_tensor_data"]
_REQUEST_ID = REQUEST_ID_HEADER.encode()


class ModelSchemas:
    """Each served model's inputs and outputs, read (``read``: from the registry) once per model URI: a version's
    signature never changes."""

    def __init__(self, home: Path, read: Callable[[str, Path], ModelIO] = model_io) -> None:
        self.home = home
        self._read = read
        self._known: dict[str, ModelIO] = {}

    async def get(self, model_uri: str) -> ModelIO:
        found = self._known.get(model_uri)
        if found is None:
            try:
                found = await run_in_threadpool(self._read, model_uri, self.home)
            except Exception as exc:
                what = type(exc).__name__
                raise unavailable(f"the model's signature could not be read from the registry ({what})") from None
            self._known[model_uri] = found
        return found


class OipPlane:
    def __init__(
        self,
        manager: EndpointManager,
        tokens: Tokens,
        data_plane: InvocationsHandler,
        schemas: ModelSchemas | None = None,
    ) -> None:
        self.manager = manager
        self.tokens = tokens
        self.data_plane = data_plane
        self.schemas = schemas or ModelSchemas(manager.home)
        try:
            self.version = version("tollfree")
        except PackageNotFoundError:
            self.version = "0"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        path, method = scope["path"].rstrip("/") or "/", scope["method"]
        try:
            match = MODEL.match(path)
            if match is not None:
                name, pinned, action = match.groups()
                if action == "infer" and method == "POST":
                    await self._infer(headers, receive, send, name, pinned)
                    return
                self.caller(_auth(headers), name)  # a stranger learns nothing, not even 405
                _method(method, "POST" if action == "infer" else "GET")
                if action == "ready":
                    ready = await self.model_ready(name, pinned)
                    await send_body(send, 200 if ready else 400, orjson.dumps({"name": name, "ready": ready}), [])
                else:
                    await send_body(send, 200, orjson.dumps(await self.model_metadata(name, pinned)), [])
                return
            self.caller(_auth(headers))
            _method(method, "GET")
            if path in (PREFIX + "/health/live", PREFIX + "/health/ready"):
                await send_body(send, 200, orjson.dumps({"live" if path.endswith("live") else "ready": True}), [])
            elif path == PREFIX:
                await send_body(send, 200, orjson.dumps(self.server_metadata()), [])
            else:
                raise not_found("no such route of the Open Inference Protocol")
        except ApiError as err:
            await send_body(send, err.status_code, oip.error_json(err), error_headers(err))

    def caller(self, authorization: str | None, name: str | None = None) -> Principal:
        """The caller of a route that is not inference, with a right to endpoint ``name`` when one is named, and
        within its rate limit, as every route is (inference: the data plane's ``admit``)."""
        who = authenticate(self.tokens, authorization) if name is None else authorize(self.tokens, authorization, name)
        self.data_plane.limiter.admit(who.name, who.rate_limit)
        return who

    def server_metadata(self) -> dict[str, Any]:
        return {"name": SERVER_NAME, "version": self.version, "extensions": EXTENSIONS}

    async def model_ready(self, name: str, pinned: str | None) -> bool:
        """Whether a replica of the endpoint (of the entity serving version ``pinned``) is ready."""
        live = await self._live(name)
        return _ready(live, _entity(live, name, pinned))

    async def model_metadata(self, name: str, pinned: str | None) -> dict[str, Any]:
        live = await self._live(name)
        entity = _entity(live, name, pinned)
        served = [(share, e) for e, share in live.weights if e in live.replica_sets]
        chosen = entity or (max(served)[1] if served else "")  # the entity with the largest share of the traffic
        replica_set = live.replica_sets.get(chosen)
        if replica_set is None:  # none is a registered model: an endpoint of external chat models
            raise invalid_parameter(f"endpoint {name} serves external chat models: use the chat routes")
        io = await self.schemas.get(replica_set.model_uri)
        versions = [pinned] if pinned else sorted({str(s.version) for s in live.replica_sets.values()})
        return oip.model_metadata(name, versions, io)

    async def _live(self, name: str) -> LiveEndpoint:
        return self.manager.live.get(name) or await self.manager.served(name)

    async def infer(
        self,
        headers: dict[bytes, bytes],
        name: str,
        pinned: str | None,
        request_id: str,
        read: Callable[[], Awaitable[oip.InferRequest]],
    ) -> Inference:
        """One inference, whatever its transport: admitted (``headers``: the caller's authorization), its request
        read (``read``), scored by the data plane, its output tensors taken from the predictions, metered and
        logged."""
        started = time.perf_counter()
        done = Inference(Reply())
        reply = done.reply
        in_flight = self.data_plane.metrics.in_flight.labels(name)
        in_flight.inc()
        try:
            self.data_plane.admit(headers, name)
            done.request = request = await read()
            live = await self._live(name)
            entity = _entity(live, name, pinned) or choose_entity(live.weights, self.data_plane.rng)
            replica_set = live.replica_sets.get(entity)
            if replica_set is None:
                raise invalid_parameter(f"served entity {entity} is an external chat model: use the chat routes")
            io = await self.schemas.get(replica_set.model_uri)
            oip.check_outputs(request, io)
            reply.request_body = scoring = oip.scoring_body(request, io)
            await self.data_plane.score_on_entity(
                live, name, entity, WireRequest(request_id, "application/json", scoring), reply
            )
            if reply.answer is not None and reply.status == 200:
                done.outputs = oip.output_tensors(reply.answer.first, request, io)
            else:
                done.message = _message(reply.body)
        except ApiError as err:
            reply.refused(err)
            done.outputs, done.message = None, err.message
        finally:
            in_flight.dec()
        self.data_plane.record(name, request_id, reply, time.perf_counter() - started)
        return done

    async def _infer(self, headers: dict[bytes, bytes], receive: Any, send: Any, name: str, pinned: str | None) -> None:
        """One inference over REST: the JSON (and binary data) in, output tensors out."""
        request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)

        async def read() -> oip.InferRequest:
            return oip.parse_infer(await self.data_plane.body(receive), _header_length(headers))

        done = await self.infer(headers, name, pinned, request_id, read)
        reply, body, content_type, extra = done.reply, b"", b"application/json", []
        if done.outputs is not None and done.request is not None:
            body, length = oip.encode_response(done.outputs, done.request, name, reply.version)
            if length is not None:
                content_type = oip.BINARY_CONTENT_TYPE.encode()
                extra = [(oip.BINARY_HEADER.encode(), str(length).encode())]
        else:
            body = orjson.dumps({"error": done.message or "the model failed"})
        out = [(_REQUEST_ID, request_id.encode()), *extra, *[h for h in reply.headers if h[0] != b"content-type"]]
        await send_body(send, reply.status, body, out, content_type)
        self.mirror(done)

    def mirror(self, done: Inference) -> None:
        """The request's copies to the endpoint's shadows, once its answer is on its way."""
        reply = done.reply
        if reply.scored is not None and reply.answer is not None:
            self.data_plane.shadows.mirror(*reply.scored, reply.served_entity)


@dataclass
class Inference:
    """What one inference gave: the reply (status, served entity, version), the request as read, and its output
    tensors when the model answered, else the error's message."""

    reply: Reply
    request: oip.InferRequest | None = None
    outputs: list[oip.Output] | None = None
    message: str | None = None


def _entity(live: LiveEndpoint, name: str, pinned: str | None) -> str | None:
    """The served entity serving model version ``pinned`` (404 when none does); None when no version is pinned."""
    if pinned is None:
        return None
    for entity, replica_set in live.replica_sets.items():
        if str(replica_set.version) == pinned:
            return entity
    raise not_found(f"model {name} has no version {pinned[:64]!r} served")


def _ready(live: LiveEndpoint, entity: str | None) -> bool:
    sets = [live.replica_sets[entity]] if entity is not None else list(live.replica_sets.values())
    return any(replica_set.ready_count() > 0 for replica_set in sets)


def _method(method: str, allowed: str) -> None:
    if method != allowed:
        raise ApiError(405, "BAD_REQUEST", f"this route of the Open Inference Protocol takes {allowed}")


def _auth(headers: dict[bytes, bytes]) -> str | None:
    return headers.get(b"authorization", b"").decode("latin-1") or None


def _header_length(headers: dict[bytes, bytes]) -> int | None:
    raw = headers.get(oip.BINARY_HEADER.encode())
    if raw is None:
        return None
    if not raw.isdigit():
        raise invalid_parameter(f"{oip.BINARY_HEADER} must be a number of bytes")
    return int(raw)


def _message(error_body: bytes) -> str:
    try:
        return str(orjson.loads(error_body).get("message", "the model failed"))
    except (orjson.JSONDecodeError, AttributeError):
        return "the model failed"
