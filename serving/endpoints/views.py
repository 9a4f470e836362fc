"""An endpoint record as Databricks returns it (``ServingEndpointDetailed``), with its served entities'
deployment states derived from the endpoint's."""

from __future__ import annotations

from typing import Any

from serving.endpoints.external import external_view
from serving.endpoints.spec import EndpointCoreConfig, EndpointRecord, ServedEntityInput, shadow_shares, traffic_weights


def _deployment(record: EndpointRecord, pending: bool) -> dict[str, str]:
    """Served-entity state, derived from the endpoint state (``pending``: the config being rolled out)."""
    if not pending and record.ready == "READY":
        state = "DEPLOYMENT_READY"
    elif not pending and record.config_update == "NOT_UPDATING":
        state = "DEPLOYMENT_RECOVERING"
    elif record.config_update in ("UPDATE_FAILED", "UPDATE_CANCELED"):
        state = "DEPLOYMENT_FAILED"
    else:
        state = "DEPLOYMENT_CREATING"
    out = {"deployment": state}
    if state != "DEPLOYMENT_READY" and record.state_message:
        out["deployment_state_message"] = record.state_message
    return out


def _entity_views(e: ServedEntityInput, state: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One served entity in ``ServedEntityOutput`` and in legacy ``ServedModelOutput`` shape."""
    common: dict[str, Any] = {
        "name": e.name,
        "workload_size": e.workload_size,
        "scale_to_zero_enabled": e.scale_to_zero_enabled,
        "state": dict(state),
    }
    common.update({k: getattr(e, k) for k in ("workload_type", "environment_vars") if getattr(e, k) is not None})
    if e.external_model is not None:
        external = {"external_model": external_view(e.external_model)}
        return {**common, **external}, {**common, **external}
    entity_view, model_view = {**common, "entity_name": e.entity_name}, {**common, "model_name": e.entity_name}
    version = e.resolved_version or e.entity_version
    if version is not None:
        entity_view["entity_version"] = model_view["model_version"] = version
    extensions = ("entity_alias", "min_replicas", "max_replicas", "max_concurrency", "autoscaling")
    entity_view.update({k: getattr(e, k) for k in extensions if getattr(e, k) is not None})
    return entity_view, model_view


def config_view(config: EndpointCoreConfig, version: int, state: dict[str, str]) -> dict[str, Any]:
    views = [_entity_views(e, state) for e in config.served_entities]
    shadows = dict(shadow_shares(config))
    routes = [
        {"served_entity_name": n, "served_model_name": n, "traffic_percentage": pct}
        | ({"shadow_percentage": shadows[n]} if n in shadows else {})
        for n, pct in traffic_weights(config)
    ]
    out: dict[str, Any] = {
        "served_entities": [v[0] for v in views],
        "served_models": [v[1] for v in views],
        "traffic_config": {"routes": routes},
        "config_version": version,
    }
    if config.auto_capture_config is not None:
        out["auto_capture_config"] = config.auto_capture_config.model_dump(exclude_none=True)
    if config.response_cache is not None:
        out["response_cache"] = config.response_cache.model_dump()
    if config.monitoring is not None:
        out["monitoring"] = config.monitoring.model_dump(mode="json", exclude_none=True)
    if config.stream_inputs is not None:
        out["stream_inputs"] = [s.model_dump() for s in config.stream_inputs]
    return out


def endpoint_view(record: EndpointRecord) -> dict[str, Any]:
    """The endpoint as Databricks returns it: ``ServingEndpointDetailed`` JSON."""
    view: dict[str, Any] = {
        "name": record.name,
        "id": record.id,
        "creator": record.creator,
        "creation_timestamp": record.created_ms,
        "last_updated_timestamp": record.updated_ms,
        "state": {"ready": record.ready, "config_update": record.config_update},
        "config": config_view(record.config, record.config_version, _deployment(record, pending=False)),
    }
    if record.pending_config is not None:
        pending = config_view(record.pending_config, record.config_version + 1, _deployment(record, pending=True))
        view["pending_config"] = {**pending, "start_time": record.updated_ms}
    for key in ("ai_gateway", "tags", "description"):
        if getattr(record, key):
            view[key] = getattr(record, key)
    if record.state_message:
        # tollfree extension: why the last rollout failed, even while the old config keeps serving
        view["state_message"] = record.state_message
    return view
