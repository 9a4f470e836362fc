"""The control plane's routes: the Databricks serving-endpoints API (a subset), tollfree's extensions
(an endpoint's replicas and autoscaler decisions) and the Prometheus scrape; ``install`` adds them to
the gateway's FastAPI app.

The routes read what they need from ``request.app.state``: ``manager``, ``tokens`` and ``metrics`` (set
by ``create_gateway_app``), and ``autoscaler`` while the autoscaler runs.
``Gateway`` has already checked the caller's token and, for a change, its admin right; each route
checks the token's right to the endpoint it names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from serving.endpoints import openapi, spec, views
from serving.endpoints.manager import EndpointManager
from serving.endpoints.monitoring_results import load_latest
from serving.gateway.auth import Principal, authenticate, authorize
from serving.registry.canary_store import read_state
from serving.replicas.local import rss_mb

API = "/api/2.0/serving-endpoints"


def _principal(request: Request, endpoint: str | None) -> Principal:
    """The caller, with the right to ``endpoint`` (None: an admin)."""
    return authorize(request.app.state.tokens, request.headers.get("authorization"), endpoint)


def _manager(request: Request) -> EndpointManager:
    return request.app.state.manager


async def databricks_config() -> JSONResponse:
    return JSONResponse({"error_code": "NOT_FOUND", "message": "no workspace configuration here"}, 404)


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def create_endpoint(body: spec.CreateEndpointRequest, request: Request) -> dict[str, Any]:
    who = _principal(request, None)
    record = await _manager(request).endpoints.create(body, who.name)
    return views.endpoint_view(record)


async def list_endpoints(request: Request) -> dict[str, Any]:
    who = authenticate(request.app.state.tokens, request.headers.get("authorization"))  # sees only what it may access
    records = [r for r in _manager(request).endpoints.list() if who.can_access(r.name)]
    return {"endpoints": [views.endpoint_view(r) for r in records]}


async def get_endpoint(name: str, request: Request) -> dict[str, Any]:
    _principal(request, name)
    return views.endpoint_view(_manager(request).endpoints.get(name))


async def update_config(name: str, body: spec.EndpointCoreConfig, request: Request) -> dict[str, Any]:
    _principal(request, None)
    return views.endpoint_view(await _manager(request).endpoints.update_config(name, body))


async def delete_endpoint(name: str, request: Request) -> dict[str, Any]:
    _principal(request, None)
    await _manager(request).endpoints.delete(name)
    return {}


async def put_ai_gateway(name: str, body: dict[str, Any], request: Request) -> dict[str, Any]:
    _principal(request, None)
    return await _manager(request).ai_gateways.put(name, body)


async def endpoint_metrics(name: str, request: Request) -> Response:
    _principal(request, name)
    _manager(request).endpoints.get(name)  # 404 for an unknown endpoint
    return Response(request.app.state.metrics.exposition(endpoint=name), media_type=CONTENT_TYPE_LATEST)


async def endpoint_openapi_doc(name: str, request: Request) -> JSONResponse:
    _principal(request, name)
    manager = _manager(request)
    return JSONResponse(await openapi.endpoint_document(manager.store, name, manager.home))


async def autoscaler_decisions(name: str, request: Request, limit: int = 500) -> dict[str, Any]:
    """The autoscaler's recorded decisions for this endpoint, oldest first, with their inputs."""
    _principal(request, name)
    _manager(request).endpoints.get(name)
    scaler = getattr(request.app.state, "autoscaler", None)
    if scaler is None:
        return {"enabled": False, "decisions": []}
    decisions = [d for d in scaler.controller.export() if d["endpoint"] == name][-max(1, min(limit, 5000)) :]
    backend = _manager(request).backend
    pool = backend.pool.idle if backend.pool is not None else 0
    return {
        "enabled": True,
        "warm_pool_idle": pool,
        "warm_starts": backend.warm_starts,
        "cold_starts": backend.cold_starts,
        "decisions": decisions,
    }


async def endpoint_replicas(name: str, request: Request) -> dict[str, Any]:
    """tollfree extension: the endpoint's replica processes (pid, memory, requests in flight)."""
    _principal(request, name)
    manager = _manager(request)
    manager.endpoints.get(name)
    live = manager.live.get(name)
    replicas = []
    for replica_set in live.replica_sets.values() if live else ():
        for replica in replica_set.replicas:
            replicas.append(
                {
                    "served_entity": replica_set.name,
                    "model_version": replica_set.version,
                    "pid": replica.pid,
                    "alive": replica.alive(),
                    "outstanding": replica.outstanding,
                    "rss_mb": rss_mb(replica.pid),
                }
            )
    return {"replicas": replicas}


async def prometheus(request: Request) -> Response:
    _principal(request, None)
    metrics = request.app.state.metrics
    manager = _manager(request)
    for name in manager.live:  # what the monitoring and canary flows last recorded (files: off the event loop)
        drift, canary = await run_in_threadpool(_last_runs, manager.home, name)
        if drift is not None:
            metrics.drift_findings.labels(name).set(len(drift.get("findings") or ()))
        if canary is not None:
            metrics.canary_rolled_back.labels(name).set(1 if canary.get("status") == "rolled_back" else 0)
    for name, live in manager.live.items():
        for replica_set in live.replica_sets.values():
            metrics.replicas.labels(name, replica_set.name).set(sum(r.alive() for r in replica_set.replicas))
            if replica_set.scaling is not None:  # autoscaled: the bounds the alerting rules compare with
                metrics.max_replicas.labels(name, replica_set.name).set(replica_set.scaling.max_replicas)
                metrics.latency_slo.labels(name, replica_set.name).set(replica_set.scaling.latency_slo_ms / 1000.0)
            if replica_set.dispatcher is not None:
                metrics.queue_depth.labels(name, replica_set.name).set(replica_set.dispatcher.waiting)
                metrics.queue_limit.labels(name, replica_set.name).set(replica_set.dispatcher.queue_limit)
    return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


def _last_runs(home: Path, endpoint: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The endpoint's latest skew and drift verdict and its latest canary state, as the flows recorded them."""
    return load_latest(home, endpoint), read_state(home, endpoint)


def install(app: FastAPI) -> None:
    """Add every control-plane route to ``app`` (on the app itself, so ``app.routes`` lists each one). The probes
    are left out of the OpenAPI schema."""
    for method, path, endpoint, listed in (
        ("GET", "/.well-known/databricks-config", databricks_config, False),
        ("GET", "/healthz", healthz, False),
        ("POST", API, create_endpoint, True),
        ("GET", API, list_endpoints, True),
        ("GET", API + "/{name}", get_endpoint, True),
        ("PUT", API + "/{name}/config", update_config, True),
        ("DELETE", API + "/{name}", delete_endpoint, True),
        ("PUT", API + "/{name}/ai-gateway", put_ai_gateway, True),
        ("GET", API + "/{name}/metrics", endpoint_metrics, True),
        ("GET", API + "/{name}/openapi", endpoint_openapi_doc, True),
        ("GET", API + "/{name}/autoscaler", autoscaler_decisions, True),
        ("GET", API + "/{name}/replicas", endpoint_replicas, True),
        ("GET", "/metrics", prometheus, True),
    ):
        app.add_api_route(path, endpoint, methods=[method], include_in_schema=listed)
