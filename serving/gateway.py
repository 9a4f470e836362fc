"""The gateway: the Databricks serving-endpoints API (control plane) and the MLflow scoring protocol
(data plane) in one FastAPI app. Every route but the health check and the SDK's config probe needs a
bearer token."""

from __future__ import annotations

import json
import logging
import random
import time
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from serving import endpoint_spec as spec
from serving.auth import TokenRegistry, authenticate, authorize
from serving.endpoint_manager import EndpointManager, ServedEntity
from serving.errors import (
    REQUEST_ID_HEADER, ApiError, error_body, install_error_handlers, payload_too_large, resolve_request_id,
    timeout, unavailable,
)
from serving.gateway_metrics import GatewayMetrics
from serving.inference_log import InferenceLogWriter, InferenceRecord, utc_now
from serving.replica import RETURN_FEATURES_HEADER
from serving.scoring_protocol import canonical_payload_key
from serving.admission import AdmissionRefused
from serving.router import choose_entity

log = logging.getLogger(__name__)

API = "/api/2.0/serving-endpoints"
SERVED_MODEL_HEADER = "served-model-name"
CACHE_HEADER = "x-tollfree-cache"


def create_gateway_app(
    manager: EndpointManager,
    tokens: TokenRegistry,
    inference_log: InferenceLogWriter,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    rng: random.Random | None = None,
    request_timeout_s: float = 30.0,
    max_body_bytes: int = 4 * 1024 * 1024,
) -> FastAPI:
    metrics = GatewayMetrics.create()
    route_rng = rng or random.Random()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # type: ignore[no-untyped-def]
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=128)
        app.state.client = httpx.AsyncClient(transport=transport, limits=limits, timeout=request_timeout_s)
        inference_log.start()
        await manager.restore()
        try:
            yield
        finally:
            await manager.shutdown()
            await app.state.client.aclose()
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

    @app.get("/metrics")
    async def prometheus(request: Request) -> Response:
        principal(request, None)
        for name, live in manager.live.items():
            for entity in live.entities.values():
                metrics.replicas.labels(name, entity.name).set(sum(r.alive() for r in entity.replicas))
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    # ---- data plane ----------------------------------------------------------------------------
    async def forward(entity: ServedEntity, body: bytes, content_type: str, request_id: str, name: str) -> dict[str, Any]:
        """One admitted call to a replica of ``entity``; its JSON answer, or the replica's error as ApiError."""
        try:
            replica = await entity.admission.acquire(lambda: [r for r in entity.replicas if r.alive()], entity.max_concurrency)
        except AdmissionRefused as refused:
            raise ApiError(429, "REQUEST_LIMIT_EXCEEDED", f"endpoint {name} is at capacity ({refused.reason}); retry shortly",
                           headers={"Retry-After": str(refused.retry_after_s)}) from refused
        try:
            upstream = await app.state.client.post(
                f"{replica.url}/invocations",
                content=body,
                headers={"content-type": content_type, REQUEST_ID_HEADER: request_id, RETURN_FEATURES_HEADER: "1"},
            )
        except httpx.TimeoutException as exc:
            raise timeout(f"the model did not answer within {request_timeout_s:.0f}s; request id {request_id}") from exc
        except httpx.TransportError as exc:
            raise unavailable(f"no replica of endpoint {name} could be reached; request id {request_id}") from exc
        finally:
            await entity.admission.release(replica)
        payload = upstream.json()
        if upstream.status_code != 200:
            raise ApiError(upstream.status_code, payload.get("error_code", "INTERNAL_ERROR"), payload.get("message", ""))
        return payload

    @app.post("/serving-endpoints/{name}/invocations")
    async def invocations(name: str, request: Request) -> Response:
        started = time.perf_counter()
        request_id = resolve_request_id(request.headers.get(REQUEST_ID_HEADER))
        entity_name: str | None = None
        version: str | None = None
        body = b""
        served_features = None
        outputs = None
        metrics.in_flight.labels(name).inc()
        try:
            principal(request, name)
            declared = request.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > max_body_bytes:
                raise payload_too_large(f"request body over the limit of {max_body_bytes} bytes")
            body = await request.body()
            if len(body) > max_body_bytes:
                raise payload_too_large(f"request body over the limit of {max_body_bytes} bytes")
            live = manager.served(name)
            entity_name = choose_entity(live.weights, route_rng)
            entity = live.entities[entity_name]
            version = entity.version
            content_type = request.headers.get("content-type", "")
            cache_key = None
            if live.cache is not None and content_type.split(";")[0].strip().lower() == "application/json":
                try:
                    cache_key = (entity_name, entity.version, canonical_payload_key(body))
                except ApiError:
                    cache_key = None  # not JSON: the replica answers with the precise error
            cached = live.cache.get(cache_key) if live.cache is not None and cache_key else None
            if cached is not None:
                payload = cached
                metrics.cache_hits.labels(name).inc()
                extra = {CACHE_HEADER: "hit"}
            else:
                payload = await forward(entity, body, content_type, request_id, name)
                served_features = payload.pop("served_features", None)
                if live.cache is not None and cache_key:
                    live.cache.put(cache_key, payload)
                extra = {CACHE_HEADER: "miss"} if live.cache is not None else {}
            outputs = payload.get("predictions")
            response: Response = JSONResponse(payload, headers={SERVED_MODEL_HEADER: entity_name, REQUEST_ID_HEADER: request_id, **extra})
            status, error_code = 200, None
        except ApiError as err:
            response = JSONResponse(error_body(err), status_code=err.status_code, headers={**err.headers, REQUEST_ID_HEADER: request_id})
            status, error_code = err.status_code, err.error_code
        finally:
            metrics.in_flight.labels(name).dec()
        elapsed = time.perf_counter() - started
        metrics.requests.labels(name, entity_name or "", str(status)).inc()
        metrics.latency.labels(name, entity_name or "").observe(elapsed)
        inference_log.record(
            InferenceRecord(
                request_id=request_id, timestamp=utc_now(), endpoint=name, served_entity=entity_name,
                model_version=version, status_code=status, latency_ms=elapsed * 1000,
                inputs=body.decode("utf-8", "replace") if body else None,
                served_features=json.dumps(served_features) if served_features is not None else None,
                outputs=json.dumps(outputs) if outputs is not None else None,
                error_code=error_code, rows=len(served_features) if isinstance(served_features, list) else (len(outputs) if isinstance(outputs, list) else 0),
            )
        )
        return response

    return app
