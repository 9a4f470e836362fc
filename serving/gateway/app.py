"""The gateway: the Databricks serving-endpoints API (control plane) and the MLflow scoring protocol
(data plane) in one FastAPI app. Every route but the health check and the SDK's config probe needs a
bearer token: ``Gateway`` checks it before FastAPI sees the request (so no route, ``/openapi.json`` and
unknown paths included, answers an anonymous caller with anything but 401), and each route then checks
the token's rights. Per-token rate limits apply to both planes. ``Gateway.public()`` is the view for a
public port when the admin API is bound to its own port: the data plane and the health probes only."""

from __future__ import annotations

import asyncio
import logging
import random
from contextlib import asynccontextmanager
from typing import Any

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving.endpoints import spec
from serving.endpoints.manager import EndpointManager
from serving.gateway.auth import TokenRegistry, authenticate, authorize
from serving.gateway.autoscaling import LiveAutoscaler
from serving.gateway.data_plane import INVOCATIONS, InvocationsHandler
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.rate_limit import TokenBuckets
from serving.inference_log import InferenceLogWriter
from serving.protocol.errors import ApiError, error_body, install_error_handlers, not_found, payload_too_large, permission_denied
from serving.replicas.local import rss_mb
from serving.replicas.local_backend import LocalBackend
from serving.replicas.warm_pool import WarmPool

log = logging.getLogger(__name__)

API = "/api/2.0/serving-endpoints"
PUBLIC_PATHS = frozenset({"/healthz", "/.well-known/databricks-config"})  # the only routes without a token
_READS = frozenset({"GET", "HEAD"})
_ADMIN_READS = frozenset({"/metrics"})


def create_gateway_app(
    manager: EndpointManager,
    tokens: TokenRegistry,
    inference_log: InferenceLogWriter,
    *,
    rng: random.Random | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
    autoscale: bool = False,
    warm_pool_size: int = 0,
    autoscale_interval_s: float = 1.0,
    metrics: GatewayMetrics | None = None,
    limiter: TokenBuckets | None = None,
) -> Gateway:
    """The gateway app. ``autoscale`` runs the autoscaler on local replica processes, with
    ``warm_pool_size`` standby processes kept ready (``python -m serving`` turns both on)."""
    metrics = metrics or GatewayMetrics.create()
    limiter = limiter or TokenBuckets()
    route_rng = rng or random.Random()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        inference_log.start()
        await manager.open()
        await manager.restore()
        backend = task = None
        if autoscale:
            pool = WarmPool(warm_pool_size, manager.launcher) if warm_pool_size else None
            backend = LocalBackend(manager.entity, manager.launcher, pool)
            scaler = LiveAutoscaler(manager, backend, interval_s=autoscale_interval_s,
                                    starting=lambda key: backend.starting.get(key, 0))
            app.state.autoscaler, app.state.autoscaler_backend = scaler, backend
            metrics.registry.register(scaler.controller.collector())
            if pool is not None:
                asyncio.get_running_loop().run_in_executor(None, pool.fill)
            task = asyncio.get_running_loop().create_task(scaler.run())
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            if backend is not None:
                await backend.close()
            await manager.shutdown()
            inference_log.close()

    app = FastAPI(title="tollfree gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    app.state.manager = manager
    app.state.metrics = metrics

    def principal(request: Request, endpoint: str | None):  # type: ignore[no-untyped-def]
        return authorize(tokens, request.headers.get("authorization"), endpoint)

    @app.get("/.well-known/databricks-config", include_in_schema=False)
    async def databricks_config() -> JSONResponse:
        return JSONResponse({"error_code": "NOT_FOUND", "message": "no workspace configuration here"}, 404)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # ---- control plane -------------------------------------------------------------------------
    @app.post(API)
    async def create_endpoint(body: spec.CreateEndpointRequest, request: Request) -> dict[str, Any]:
        who = principal(request, None)
        record = await manager.create(body, who.name)
        return spec.endpoint_view(record)

    @app.get(API)
    async def list_endpoints(request: Request) -> dict[str, Any]:
        who = authenticate(tokens, request.headers.get("authorization"))  # sees only what it may access
        records = [r for r in manager.store.list() if who.can_access(r.name)]
        return {"endpoints": [spec.endpoint_view(r) for r in records]}

    @app.get(API + "/{name}")
    async def get_endpoint(name: str, request: Request) -> dict[str, Any]:
        principal(request, name)
        return spec.endpoint_view(manager.store.get(name))

    @app.put(API + "/{name}/config")
    async def update_config(name: str, body: spec.EndpointCoreConfig, request: Request) -> dict[str, Any]:
        principal(request, None)
        return spec.endpoint_view(await manager.update_config(name, body))

    @app.delete(API + "/{name}")
    async def delete_endpoint(name: str, request: Request) -> dict[str, Any]:
        principal(request, None)
        await manager.delete(name)
        return {}

    @app.put(API + "/{name}/ai-gateway")
    async def put_ai_gateway(name: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
        principal(request, None)
        return await manager.set_ai_gateway(name, body)

    @app.get(API + "/{name}/metrics")
    async def endpoint_metrics(name: str, request: Request) -> Response:
        principal(request, name)
        manager.store.get(name)  # 404 for an unknown endpoint
        return Response(metrics.exposition(endpoint=name), media_type=CONTENT_TYPE_LATEST)

    @app.get(API + "/{name}/openapi")
    async def endpoint_openapi_doc(name: str, request: Request) -> JSONResponse:
        principal(request, name)
        return JSONResponse(await manager.openapi(name))

    @app.get(API + "/{name}/autoscaler")
    async def autoscaler_decisions(name: str, request: Request, limit: int = 500) -> dict[str, Any]:
        """The autoscaler's recorded decisions for this endpoint, oldest first, with their inputs."""
        principal(request, name)
        manager.store.get(name)
        scaler = getattr(app.state, "autoscaler", None)
        if scaler is None:
            return {"enabled": False, "decisions": []}
        decisions = [d for d in scaler.controller.export() if d["endpoint"] == name][-max(1, min(limit, 5000)):]
        backend = app.state.autoscaler_backend
        pool = backend.pool.idle if backend.pool is not None else 0
        return {"enabled": True, "warm_pool_idle": pool, "warm_starts": backend.warm_starts,
                "cold_starts": backend.cold_starts, "decisions": decisions}

    @app.get(API + "/{name}/replicas")
    async def endpoint_replicas(name: str, request: Request) -> dict[str, Any]:
        """tollfree extension: the endpoint's replica processes (pid, memory, requests in flight)."""
        principal(request, name)
        manager.store.get(name)
        live = manager.live.get(name)
        replicas = []
        for entity in (live.entities.values() if live else ()):
            for replica in entity.replicas:
                replicas.append({"served_entity": entity.name, "model_version": entity.version, "pid": replica.pid,
                                 "alive": replica.alive(), "outstanding": replica.outstanding,
                                 "rss_mb": rss_mb(replica.pid)})
        return {"replicas": replicas}

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        principal(request, None)
        for name, live in manager.live.items():
            for entity in live.entities.values():
                metrics.replicas.labels(name, entity.name).set(sum(r.alive() for r in entity.replicas))
                if entity.dispatcher is not None:
                    metrics.queue_depth.labels(name, entity.name).set(entity.dispatcher.waiting)
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    data_plane = InvocationsHandler(manager, tokens, inference_log, metrics, rng=route_rng, max_body_bytes=max_body_bytes,
                                    limiter=limiter)
    return Gateway(app, data_plane, tokens, limiter, max_body_bytes)


class Gateway:
    """The ASGI app: invocations go straight to the data plane, everything else to FastAPI once the
    caller's token is known (and within its rate limit).

    ``state`` is the FastAPI app's, so ``app.state.manager`` works on either."""

    def __init__(self, control: FastAPI, data_plane: InvocationsHandler, tokens: TokenRegistry, limiter: TokenBuckets,
                 max_body_bytes: int = 4 * 1024 * 1024) -> None:
        self.control = control
        self.data_plane = data_plane
        self.tokens = tokens
        self.limiter = limiter
        self.max_body_bytes = max_body_bytes
        self.state = control.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST":
                match = INVOCATIONS.match(scope["path"])
                if match is not None:
                    await self.data_plane(scope, receive, send, match.group(1))
                    return
            if scope["path"] not in PUBLIC_PATHS:
                try:
                    who = authenticate(self.tokens, _header(scope, b"authorization"))
                    self.limiter.admit(who.name, who.rate_limit)
                    if not who.admin and (scope["method"] not in _READS or scope["path"] in _ADMIN_READS):
                        # every change is an admin's: refuse before FastAPI parses (and answers about) the body
                        raise permission_denied("this operation requires an admin token")
                    declared = _header(scope, b"content-length") or ""
                    if declared.isdigit() and int(declared) > self.max_body_bytes:
                        raise payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
                except ApiError as err:
                    await _send_error(send, err)
                    return
                if scope["method"] not in _READS:  # control-plane bodies are small: read them here, within the limit
                    body, whole = await _read_bounded(receive, self.max_body_bytes)
                    if not whole:
                        await _send_error(send, payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes"))
                        return
                    receive = _replay(body, receive)
        await self.control(scope, receive, send)

    def public(self) -> PublicGateway:
        """The app for the public port when the admin API has its own: data plane and health probes only."""
        return PublicGateway(self)


class PublicGateway:
    """The data plane and the unauthenticated probes of ``gateway``; every other path is 404 here."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.state = gateway.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not (scope["path"] in PUBLIC_PATHS or (
                scope["method"] == "POST" and INVOCATIONS.match(scope["path"]) is not None)):
            await _send_error(send, not_found("no such route on this port (the admin API listens on its own port)"))
            return
        await self.gateway(scope, receive, send)


async def _read_bounded(receive: Any, limit: int) -> tuple[bytes, bool]:
    """The whole request body, or (what came, False) once it passes ``limit`` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), True  # the client went away: FastAPI sees an empty body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return b"", False
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks), True


def _replay(body: bytes, receive: Any) -> Any:
    """``receive`` that hands FastAPI the already-read ``body`` first, then the connection's own messages."""
    sent = False

    async def replay() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1") or None
    return None


async def _send_error(send: Any, err: ApiError) -> None:
    body = orjson.dumps(error_body(err))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in err.headers.items())]
    await send({"type": "http.response.start", "status": err.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
