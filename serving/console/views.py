"""What the console's pages show, computed from an endpoint's view (the API's GET), its timeline and its canary
state. Pure: the caller reads them and gives the time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serving.console.timeline import Point

WINDOW_S = 60.0  # the overview's figures: over the last minute


def traffic_split(view: Mapping[str, Any]) -> dict[str, int]:
    """Each served entity's share of the traffic, in percent (all of it to the only one when no route is given)."""
    config = view.get("config") or {}
    routes = (config.get("traffic_config") or {}).get("routes") or []
    if routes:
        return {r["served_model_name"]: int(r["traffic_percentage"]) for r in routes}
    entities = config.get("served_entities") or []
    return {entities[0]["name"]: 100} if len(entities) == 1 else {}


def _recent(points: Sequence[Point], now: float) -> list[Point]:
    return [p for p in points if p.t > now - WINDOW_S]


def figures(points: Sequence[Point], now: float) -> dict[str, Any]:
    """One entity's last minute: requests and 5xx a second, the highest per-second p99 (an upper bound of the
    minute's p99), and the replicas the autoscaler asked for at its newest point."""
    recent = _recent(points, now)
    p99s = [p.p99_ms for p in recent if p.p99_ms is not None]
    newest = points[-1] if points else None
    return {
        "requests_per_s": sum(p.requests for p in recent) / WINDOW_S,
        "errors_per_s": sum(p.errors for p in recent) / WINDOW_S,
        "p99_ms": max(p99s) if p99s else None,
        "desired": newest.desired if newest is not None else None,
    }


def overview_row(
    view: Mapping[str, Any],
    points: Mapping[str, Sequence[Point]],
    ready: Mapping[str, int],
    slo_ms: Mapping[str, float],
    canary: Mapping[str, Any] | None,
    monitoring: Mapping[str, Any] | None,
    now: float,
) -> dict[str, Any]:
    """An endpoint's row on the overview: its state, served entities with their versions, share and ready replicas
    (``ready``, as the gateway routes now), last minute's figures per entity and in all, and what needs a look
    (``flags``): not ready, an update in progress, a p99 over its goal, a canary in progress, drift or skew found by
    the last monitoring run (``monitoring``, ``serving.endpoints.monitoring_results``)."""
    state = view.get("state") or {}
    split = traffic_split(view)
    entities = []
    for entity in (view.get("config") or {}).get("served_entities") or []:
        name = entity["name"]
        entities.append(
            {
                "name": name,
                "model": entity.get("entity_name"),
                "version": entity.get("entity_version"),
                "traffic_percentage": split.get(name, 0),
                "ready": ready.get(name, 0),
                "slo_ms": slo_ms.get(name),
                **figures(points.get(name, ()), now),
            }
        )
    requests = sum(e["requests_per_s"] for e in entities)
    errors = sum(e["errors_per_s"] for e in entities)
    flags = []
    if state.get("ready") != "READY":
        flags.append("not ready")
    if state.get("config_update") == "IN_PROGRESS":
        flags.append("config update in progress")
    over = [e["name"] for e in entities if e["p99_ms"] is not None and e["slo_ms"] and e["p99_ms"] > e["slo_ms"]]
    if over:
        flags.append("p99 over the latency goal: " + ", ".join(over))
    if canary is not None and canary.get("status") == "active":
        flags.append(f"canary at {canary.get('traffic')} %")
    if monitoring is not None and monitoring.get("verdict") == "findings":
        flags.append(f"the last monitoring run found {len(monitoring.get('findings') or ())} (skew or drift)")
    return {
        "name": view.get("name"),
        "ready": state.get("ready"),
        "config_update": state.get("config_update"),
        "entities": entities,
        "requests_per_s": requests,
        "error_ratio": errors / requests if requests else None,
        "ready_replicas": sum(e["ready"] for e in entities),
        "flags": flags,
    }


def canary_summary(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The canary's state as the console shows it: where it stands and its last verdict with the figures behind it."""
    if state is None:
        return None
    history = list(state.get("history") or ())
    return {
        "status": state.get("status"),
        "traffic": state.get("traffic"),
        "champion": f"{state.get('champion_entity')} (v{state.get('champion_version')})",
        "challenger": f"{state.get('challenger_entity')} (v{state.get('challenger_version')})",
        "started": state.get("started"),
        "ended": state.get("ended"),
        "last_decision": state.get("last_decision"),
        "last_reason": state.get("last_reason"),
        "last_verdict": history[-1] if history else None,
    }
