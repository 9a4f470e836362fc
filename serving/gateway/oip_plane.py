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
from collections.abc import Callable
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
                self._admit(authorize(self.tokens, _auth(headers), name))  # a stranger learns nothing, not even 405
                _method(method, "POST" if action == "infer" else "GET")
                live = await self._live(name)
                entity = _entity(live, name, pinned)
                if action == "ready":
                    ready = _ready(live, entity)
                    await send_body(send, 200 if ready else 400, orjson.dumps({"name": name, "ready": ready}), [])
                else:
                    await send_body(send, 200, orjson.dumps(await self._metadata(live, name, entity, pinned)), [])
                return
            self._admit(authenticate(self.tokens, _auth(headers)))
            _method(method, "GET")
            if path in (PREFIX + "/health/live", PREFIX + "/health/ready"):
                await send_body(send, 200, orjson.dumps({"live" if path.endswith("live") else "ready": True}), [])
            elif path == PREFIX:
                doc = {"name": SERVER_NAME, "version": self.version, "extensions": EXTENSIONS}
                await send_body(send, 200, orjson.dumps(doc), [])
            else:
                raise not_found("no such route of the Open Inference Protocol")
        except ApiError as err:
            await send_body(send, err.status_code, oip.error_json(err), error_headers(err))

    def _admit(self, who: Principal) -> None:
        """Within the caller's rate limit, as every route is (inference: the data plane's ``admit``)."""
        self.data_plane.limiter.admit(who.name, who.rate_limit)

    async def _live(self, name: str) -> LiveEndpoint:
        return self.manager.live.get(name) or await self.manager.served(name)

    async def _metadata(self, live: LiveEndpoint, name: str, entity: str | None, pinned: str | None) -> dict:
        served = [(share, e) for e, share in live.weights if e in live.replica_sets]
        chosen = entity or (max(served)[1] if served else "")  # the entity with the largest share of the traffic
        replica_set = live.replica_sets.get(chosen)
        if replica_set is None:  # none is a registered model: an endpoint of external chat models
            raise invalid_parameter(f"endpoint {name} serves external chat models: use the chat routes")
        io = await self.schemas.get(replica_set.model_uri)
        versions = [pinned] if pinned else sorted({str(s.version) for s in live.replica_sets.values()})
        return oip.model_metadata(name, versions, io)

    async def _infer(self, headers: dict[bytes, bytes], receive: Any, send: Any, name: str, pinned: str | None) -> None:
        """One inference: admitted, converted, scored by the data plane, answered as tensors, logged."""
        started = time.perf_counter()
        request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)
        reply = Reply()
        in_flight = self.data_plane.metrics.in_flight.labels(name)
        in_flight.inc()
        body, content_type, extra = b"", b"application/json", []
        try:
            self.data_plane.admit(headers, name)
            raw = await self.data_plane.body(receive)
            request = oip.parse_infer(raw, _header_length(headers))
            live = await self._live(name)
            entity = _entity(live, name, pinned) or choose_entity(live.weights, self.data_plane.rng)
            replica_set = live.replica_sets.get(entity)
            if replica_set is None:
                raise invalid_parameter(f"served entity {entity} is an external chat model: use the chat routes")
            io = await self.schemas.get(replica_set.model_uri)
            oip.check_outputs(request, io)
            reply.request_body = scoring = oip.scoring_body(request, io)
            wire = WireRequest(request_id, "application/json", scoring)
            await self.data_plane.score_on_entity(live, name, entity, wire, reply)
            if reply.answer is not None and reply.status == 200:
                body, length = oip.infer_response(reply.answer.first, request, name, reply.version, io)
                if length is not None:
                    content_type = oip.BINARY_CONTENT_TYPE.encode()
                    extra = [(oip.BINARY_HEADER.encode(), str(length).encode())]
            else:
                body = orjson.dumps({"error": _message(reply.body)})
        except ApiError as err:
            reply.refused(err)
            body = oip.error_json(err)
        finally:
            in_flight.dec()
        out = [(_REQUEST_ID, request_id.encode()), *extra, *[h for h in reply.headers if h[0] != b"content-type"]]
        await send_body(send, reply.status, body, out, content_type)
        self.data_plane.record(name, request_id, reply, time.perf_counter() - started)


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
