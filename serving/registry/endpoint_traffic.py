"""An endpoint's served entities and traffic as the canary moves them, through the gateway's serving-endpoints
API: the config bodies it sends (every entity resent exactly as it was, so a traffic-only change restarts no
replica) and the check that a traffic change settled.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class EndpointApi(Protocol):
    """The gateway's serving-endpoints API as the canary drives it (the flows' ``GatewayApi``)."""

    def get(self, endpoint: str) -> dict[str, Any]: ...

    def apply(self, endpoint: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """PUT a config and wait for it to settle; the settled view."""
        ...


_ENTITY_KEYS = (
    "name",
    "entity_name",
    "workload_size",
    "workload_type",
    "scale_to_zero_enabled",
    "environment_vars",
    "min_replicas",
    "max_replicas",
    "max_concurrency",
    "autoscaling",
)


def entity_input(view_entity: Mapping[str, Any]) -> dict[str, Any]:
    """A served entity of an endpoint view as a config input: an alias entity keeps its alias only."""
    out = {k: view_entity[k] for k in _ENTITY_KEYS if k in view_entity}
    if view_entity.get("entity_alias"):
        out["entity_alias"] = view_entity["entity_alias"]
    else:
        out["entity_version"] = str(view_entity["entity_version"])
    return out


def routes_of(view: Mapping[str, Any]) -> dict[str, int]:
    """Served entity name -> traffic percentage of the endpoint's current config."""
    return {r["served_entity_name"]: int(r["traffic_percentage"]) for r in view["config"]["traffic_config"]["routes"]}


def shadows_of(view: Mapping[str, Any]) -> dict[str, int]:
    """Served entity name -> shadow percentage of each shadow of the endpoint's current config."""
    routes = view.get("config", {}).get("traffic_config", {}).get("routes", [])  # none before the first config
    return {r["served_entity_name"]: int(r["shadow_percentage"]) for r in routes if r.get("shadow_percentage")}


def config_body(
    view: Mapping[str, Any],
    entities: list[dict[str, Any]],
    routes: Mapping[str, int],
    shadows: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """A config request with ``entities``, ``routes`` and ``shadows`` (None: the view's), keeping the view's
    cache, capture and monitoring settings, so a traffic change resends every entity exactly as it was (an alias
    stays an alias)."""
    shadows = shadows_of(view) if shadows is None else shadows
    body: dict[str, Any] = {
        "served_entities": entities,
        "traffic_config": {
            "routes": [
                {"served_entity_name": e["name"], "traffic_percentage": int(routes.get(e["name"], 0))}
                | ({"shadow_percentage": shadows[e["name"]]} if shadows.get(e["name"]) else {})
                for e in entities
            ]
        },
    }
    for key in ("response_cache", "auto_capture_config", "monitoring"):
        if key in view["config"]:
            body[key] = view["config"][key]
    return body


def served(view: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The served entity ``name`` of an endpoint view, or None."""
    return next((e for e in view["config"]["served_entities"] if e["name"] == name), None)


def set_traffic(
    api: EndpointApi,
    endpoint: str,
    view: dict[str, Any],
    routes: dict[str, int],
    timeout_s: float,
    shadows: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """Apply ``routes`` (and ``shadows``; None: the view's) over the view's (every entity resent as it is) and wait
    until they hold; the settled view. A change that does not settle to those routes is an error naming the
    endpoint."""
    entities = [entity_input(e) for e in view["config"]["served_entities"]]
    settled = api.apply(endpoint, config_body(view, entities, routes, shadows), timeout_s)
    if settled["state"]["config_update"] != "NOT_UPDATING" or routes_of(settled) != {**routes_of(view), **routes}:
        raise RuntimeError(
            f"endpoint {endpoint}: traffic change did not apply ({settled.get('state_message', settled['state'])})"
        )
    return settled
