"""The gateway: the Databricks serving-endpoints API (control plane, ``control_plane``) and the MLflow
scoring protocol (data plane, ``data_plane``) in one ASGI app. Every route but the health check and the
SDK's config probe needs a bearer token: ``Gateway`` checks it before FastAPI sees the request (so no
route, ``/openapi.json`` and unknown paths included, answers an anonymous caller with anything but 401),
and each route then checks the token's rights. Per-token rate limits apply to both planes.
``Gateway.public()`` is the view for a public port when the admin API is bound to its own port: the data
plane, the health probes and the routes edge devices call. The edge routes (``serving.edge.api``) check their
own tokens: a device's, or an admin's."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI

from serving.console.routes import Console
from serving.console.timeline import Timeline
from serving.edge.api import PREFIX as EDGE_PREFIX
from serving.edge.api import EdgeApi
from serving.endpoints.manager import EndpointManager
from serving.gateway import control_plane
from serving.gateway.auth import Tokens, authenticate
from serving.gateway.chat_plane import OPENAI_ROUTE, ChatPlane
from serving.gateway.data_plane import INVOCATIONS, InvocationsHandler
from serving.gateway.lifespan import AutoscalerSettings, lifespan
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.oip_plane import PREFIX as OIP_PREFIX
from serving.gateway.oip_plane import ModelSchemas, OipPlane
from serving.gateway.rate_limit import TokenBuckets
from serving.gateway.scrape_targets import ScrapeTargets
from serving.gateway.streaming import StreamSupervisor
from serving.inference_log import InferenceLogWriter
from serving.protocol.errors import (
    ApiError,
    error_body,
    install_error_handlers,
    not_found,
    payload_too_large,
    permission_denied,
)

if TYPE_CHECKING:  # imported when a gRPC port is asked for: grpcio and the protocol's compiled messages
    pass

log = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/.well-known/databricks-config"})  # the only routes without a token
EDGE_DEVICES = EDGE_PREFIX + "/devices"  # under it, the routes a device calls with its own token
CONSOLE = "/console"  # the console's paths (``serving.console``), on the control-plane port only
READ_METHODS = frozenset({"GET", "HEAD"})  # the only control-plane methods a non-admin token may use
ADMIN_ONLY_READS = frozenset({"/metrics"})  # reads only the admin token may make


def create_gateway_app(
    manager: EndpointManager,
    tokens: Tokens,
    inference_log: InferenceLogWriter,
    *,
    rng: random.Random | None = None,
    max_body_bytes: int = 4 * 1024 * 1024,
    autoscale: bool = False,
    warm_pool_size: int = 0,
    autoscale_interval_s: float = 1.0,
    metrics: GatewayMetrics | None = None,
    limiter: TokenBuckets | None = None,
    stream_claim_idle_s: float = 30.0,
    scrape_targets: ScrapeTargets | None = None,
    model_schemas: ModelSchemas | None = None,
    grpc_listen: tuple[str, int] | None = None,
    edge: EdgeApi | None = None,
) -> Gateway:
    """The gateway app. ``autoscale`` runs the autoscaler on local replica processes, with ``warm_pool_size``
    standby processes kept ready (``python -m serving`` turns both on). The leader consumes the endpoints' stream
    inputs (``serving.gateway.streaming``); entries another consumer left pending for ``stream_claim_idle_s`` are
    claimed. ``scrape_targets``, when given, keeps Prometheus's list of this gateway and its replicas current while
    the app runs. ``model_schemas``: where the Open Inference Protocol's routes read each model's inputs and outputs
    (default: the registry); ``grpc_listen``, when given, the host and port of its gRPC service
    (``serving.gateway.oip_grpc``), served while the app runs. ``edge``: the edge fleet's routes
    (``serving.edge.api``), which authenticate devices by their own tokens."""
    metrics = metrics or GatewayMetrics.create()
    limiter = limiter or TokenBuckets()
    autoscaling = AutoscalerSettings(warm_pool_size, autoscale_interval_s) if autoscale else None
    streams = StreamSupervisor(manager, inference_log, claim_idle_s=stream_claim_idle_s)
    metrics.registry.register(streams.collector())
    rng = rng or random.Random()
    chat = ChatPlane(manager, inference_log, metrics, rng=rng, timeout_s=manager.request_timeout_s)
    data_plane = InvocationsHandler(
        manager, tokens, inference_log, metrics, rng=rng, max_body_bytes=max_body_bytes, limiter=limiter, chat=chat
    )
    oip = OipPlane(manager, tokens, data_plane, model_schemas)
    grpc = None
    if grpc_listen is not None:
        from serving.gateway.oip_grpc import GrpcListen

        grpc = GrpcListen(oip, *grpc_listen, max_body_bytes)
    app = FastAPI(
        title="tollfree gateway",
        lifespan=lifespan(
            manager, inference_log, metrics, autoscaling, streams, chat, scrape_targets, grpc, data_plane
        ),
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    app.state.manager = manager
    app.state.metrics = metrics
    app.state.tokens = tokens
    app.state.streams = streams
    control_plane.install(app)
    app.state.timeline = Timeline()  # the console's history, fed by the autoscaler (``_start_autoscaler``)
    console = Console(app.state, app.state.timeline)
    return Gateway(app, data_plane, tokens, limiter, max_body_bytes, console, oip, edge)


class Gateway:
    """The ASGI app: invocations go straight to the data plane, everything else to FastAPI once the
    caller's token is known (and within its rate limit).

    ``state`` is the FastAPI app's, so ``app.state.manager`` works on either."""

    def __init__(
        self,
        control: FastAPI,
        data_plane: InvocationsHandler,
        tokens: Tokens,
        limiter: TokenBuckets,
        max_body_bytes: int = 4 * 1024 * 1024,
        console: Console | None = None,
        oip: OipPlane | None = None,
        edge: EdgeApi | None = None,
    ) -> None:
        self.control = control
        self.console = console
        self.oip = oip
        self.edge = edge
        self.data_plane = data_plane
        self.tokens = tokens
        self.limiter = limiter
        self.max_body_bytes = max_body_bytes
        self.state = control.state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if self.console is not None and (scope["path"] == CONSOLE or scope["path"].startswith(CONSOLE + "/")):
                await self.console(scope, receive, send)  # its own sign-in: a cookie, not a bearer header
                return
            if self.oip is not None and _is_oip(scope["path"]):
                await self.oip(scope, receive, send)  # the Open Inference Protocol: data plane, its own error shape
                return
            if self.edge is not None and scope["path"].startswith(EDGE_PREFIX + "/"):
                body, whole = await _read_bounded(receive, self.max_body_bytes)
                if not whole:
                    await _send_error(
                        send, payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
                    )
                    return
                await self.edge(scope, _replay(body, receive), send)  # devices' tokens or an admin's: checked there
                return
            if scope["method"] == "POST":
                match = INVOCATIONS.match(scope["path"])
                if match is not None:
                    await self.data_plane(scope, receive, send, match.group(1))
                    return
                if scope["path"] == OPENAI_ROUTE:
                    await self.data_plane.openai(scope, receive, send)
                    return
            if scope["path"] not in PUBLIC_PATHS:
                try:
                    who = authenticate(self.tokens, _header(scope, b"authorization"))
                    self.limiter.admit(who.name, who.rate_limit)
                    if not who.admin and (scope["method"] not in READ_METHODS or scope["path"] in ADMIN_ONLY_READS):
                        # every change is an admin's: refuse before FastAPI parses (and answers about) the body
                        raise permission_denied("this operation requires an admin token")
                    declared = _header(scope, b"content-length") or ""
                    if declared.isdigit() and int(declared) > self.max_body_bytes:
                        raise payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
                except ApiError as err:
                    await _send_error(send, err)
                    return
                # control-plane bodies are small: read them here, within the limit
                if scope["method"] not in READ_METHODS:
                    body, whole = await _read_bounded(receive, self.max_body_bytes)
                    if not whole:
                        await _send_error(
                            send, payload_too_large(f"request body over the limit of {self.max_body_bytes} bytes")
                        )
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
        if scope["type"] == "http" and not (
            scope["path"] in PUBLIC_PATHS
            or _is_oip(scope["path"])
            or scope["path"].startswith(EDGE_DEVICES + "/")  # devices reach home on the public port
            or (
                scope["method"] == "POST"
                and (INVOCATIONS.match(scope["path"]) is not None or scope["path"] == OPENAI_ROUTE)
            )
        ):
            await _send_error(send, not_found("no such route on this port (the admin API listens on its own port)"))
            return
        await self.gateway(scope, receive, send)


async def _read_bounded(receive: Any, limit: int) -> tuple[bytes, bool]:
    """The whole request body, or (what came, False) once it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
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


def _is_oip(path: str) -> bool:
    return path == OIP_PREFIX or path.startswith(OIP_PREFIX + "/")


def _header(scope: dict, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1") or None
    return None


async def _send_error(send: Any, err: ApiError) -> None:
    body = orjson.dumps(error_body(err))
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in err.headers.items()),
    ]
    await send({"type": "http.response.start", "status": err.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})
