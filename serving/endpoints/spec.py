"""Serving-endpoint requests, records and views in Databricks ``/api/2.0/serving-endpoints`` shapes.

Inputs take what databricks-sdk and MLflow send for registry models on CPU, plus tollfree extensions
(``entity_alias``, ``min/max_replicas``, ``max_concurrency``, ``autoscaling``, and on the config
``response_cache``, ``monitoring`` and ``stream_inputs``); other fields are a 400 naming them.
Messages name fields and indexes, never payload values, except an endpoint name cut to 63 characters.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from serving.autoscaler.config import REMOVED, ScalingConfig, ScalingConfigError
from serving.endpoints.external import ExternalModelInput, check_external, external_view
from serving.endpoints.monitoring import MonitoringConfig, check_monitoring
from serving.protocol.errors import invalid_parameter
from serving.streams.config import StreamInput, check_stream_inputs

log = logging.getLogger(__name__)

READY_STATES = frozenset({"READY", "NOT_READY"})
CONFIG_UPDATE_STATES = frozenset({"NOT_UPDATING", "IN_PROGRESS", "UPDATE_FAILED", "UPDATE_CANCELED"})
MAX_SERVED_ENTITIES = 15
TRUSTED_CONTEXT = {"tollfree_trusted": True}  # model_validate context for data from our own store
_ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
_SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")  # also Unity Catalog "a.b.c"
_ALIAS_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_RESERVED_ALIAS_RE = re.compile(r"^(?:latest|[vV][0-9]+)$", re.IGNORECASE)  # as MLflow reserves
_VERSION_RE = re.compile(r"^[0-9]{1,18}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_FORBID = ConfigDict(extra="forbid")


def quote_name(name: str) -> str:
    """An endpoint name for a message: JSON-escaped and cut to 63 characters."""
    return json.dumps(name[:63]) + ("..." if len(name) > 63 else "")


class ServedEntityInput(BaseModel):
    model_config = _FORBID
    name: str | None = Field(default=None, max_length=128)
    entity_name: str | None = Field(default=None, max_length=256)  # a registry model, or:
    external_model: ExternalModelInput | None = None  # a model another server runs
    entity_version: str | None = Field(default=None, max_length=18)
    entity_alias: str | None = Field(default=None, max_length=255)
    workload_size: Literal["Small", "Medium", "Large"] = "Small"
    workload_type: Literal["CPU", "CPU_MEDIUM", "CPU_LARGE"] | None = None  # GPU types: no GPUs here
    scale_to_zero_enabled: StrictBool = False
    environment_vars: dict[str, str] | None = Field(default=None, max_length=100)
    min_replicas: StrictInt | None = None
    max_replicas: StrictInt | None = None
    max_concurrency: StrictInt | None = None
    # The autoscaler's settings beyond the Databricks fields (serving.autoscaler.config.ScalingConfig).
    autoscaling: dict[str, Any] | None = None
    # Set by the server after alias resolution; a client sending it gets a 400 (see TRUSTED_CONTEXT).
    resolved_version: str | None = None

    @field_validator("entity_version", mode="before")
    @classmethod
    def _int_version(cls, value: Any) -> Any:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) else value

    @field_validator("resolved_version", mode="before")
    @classmethod
    def _server_only(cls, value: Any, info: ValidationInfo) -> Any:
        if not (info.context or {}).get("tollfree_trusted"):
            raise PydanticCustomError("extra_forbidden", "Extra inputs are not permitted")
        return value


class Route(BaseModel):
    model_config = _FORBID
    served_model_name: str | None = Field(default=None, max_length=128)
    served_entity_name: str | None = Field(default=None, max_length=128)
    traffic_percentage: StrictInt


class TrafficConfig(BaseModel):
    model_config = _FORBID
    routes: list[Route] = Field(default_factory=list, max_length=MAX_SERVED_ENTITIES)


class AutoCaptureConfigInput(BaseModel):
    model_config = _FORBID
    enabled: StrictBool = True
    catalog_name: str | None = Field(default=None, max_length=255)
    schema_name: str | None = Field(default=None, max_length=255)
    table_name_prefix: str | None = Field(default=None, max_length=255)


class ResponseCacheConfig(BaseModel):
    """tollfree extension: an exact-match response cache, off unless asked for."""

    model_config = _FORBID
    enabled: StrictBool = False
    ttl_seconds: int = Field(default=60, ge=1, le=86_400)
    max_entries: int = Field(default=10_000, ge=1, le=1_000_000)


class EndpointCoreConfig(BaseModel):
    model_config = _FORBID
    name: str | None = None  # databricks-sdk always sends it: the endpoint name
    served_entities: list[ServedEntityInput] = Field(default_factory=list)
    traffic_config: TrafficConfig | None = None
    auto_capture_config: AutoCaptureConfigInput | None = None
    response_cache: ResponseCacheConfig | None = None
    monitoring: MonitoringConfig | None = None  # tollfree extension: serving.endpoints.monitoring
    stream_inputs: list[StreamInput] | None = None  # tollfree extension: serving.streams.config


class EndpointTag(BaseModel):
    model_config = _FORBID
    key: str = Field(min_length=1, max_length=255)
    value: str | None = Field(default=None, max_length=1024)


class CreateEndpointRequest(BaseModel):
    model_config = _FORBID
    name: str = Field(max_length=1024)
    config: EndpointCoreConfig
    tags: list[EndpointTag] = Field(default_factory=list, max_length=50)
    description: str | None = Field(default=None, max_length=1024)
    route_optimized: StrictBool = False  # accepted for client compatibility; no effect here
    ai_gateway: dict[str, Any] | None = None


def validate_endpoint_name(name: str) -> str:
    if not isinstance(name, str) or not _ENDPOINT_NAME_RE.match(name):
        shown = quote_name(name) if isinstance(name, str) else "name"
        raise invalid_parameter(f"endpoint name {shown} is invalid: use 1 to 63 letters, digits, dashes or underscores")
    return name


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_parameter(message)


def is_external(e: ServedEntityInput) -> bool:
    return e.external_model is not None


def registry_entities(config: EndpointCoreConfig) -> list[ServedEntityInput]:
    """The entities that serve a registry model on replicas (all but the external models)."""
    return [e for e in config.served_entities if e.external_model is None]


def _normalize_external(p: str, e: ServedEntityInput) -> ServedEntityInput:
    assert e.external_model is not None
    _check(
        e.entity_name is None and e.entity_version is None and e.entity_alias is None,
        f"{p}: set either external_model or entity_name, not both",
    )
    replicas = ("min_replicas", "max_replicas", "max_concurrency", "autoscaling", "environment_vars")
    _check(
        all(getattr(e, k) is None for k in replicas) and not e.scale_to_zero_enabled,
        f"{p}: an external model runs no replicas here: remove {', '.join(replicas)} and scale_to_zero_enabled",
    )
    check_external(f"{p}.external_model", e.external_model)
    name = e.name if e.name is not None else e.external_model.name
    _check(bool(_SERVED_NAME_RE.match(name)), f"{p}.name must be 1 to 128 letters, digits, '_', '-' or '.'")
    return e.model_copy(update={"name": name})


def _normalize_entity(i: int, e: ServedEntityInput) -> ServedEntityInput:
    p = f"served_entities[{i}]"
    if e.external_model is not None:
        return _normalize_external(p, e)
    _check(e.entity_name is not None, f"{p}: set entity_name (a registry model) or external_model")
    assert e.entity_name is not None
    _check(
        bool(_MODEL_NAME_RE.match(e.entity_name)),
        f"{p}.entity_name must name a registered model (letters, digits, '_', '-', '.'), not a path or URI",
    )
    _check(
        (e.entity_version is None) != (e.entity_alias is None),
        f"{p}: set exactly one of entity_version or entity_alias",
    )
    version, alias, resolved = e.entity_version, e.entity_alias, e.resolved_version
    if version is not None:
        _check(
            bool(_VERSION_RE.match(version)) and int(version) >= 1,
            f"{p}.entity_version must be a model version number (digits only)",
        )
        version = resolved = str(int(version))
    if alias is not None:
        _check(
            bool(_ALIAS_RE.match(alias)) and not _RESERVED_ALIAS_RE.match(alias),
            f"{p}.entity_alias must be a registry alias (letters, digits, '_', '-'; not reserved)",
        )
    name = e.name if e.name is not None else f"{e.entity_name}-{version or alias}"
    hint = "" if e.name is not None else " (the default name is too long: set name)"
    _check(bool(_SERVED_NAME_RE.match(name)), f"{p}.name must be 1 to 128 letters, digits, '_', '-' or '.'{hint}")
    _check(
        all(_ENV_NAME_RE.match(k) for k in e.environment_vars or {}),
        f"{p}.environment_vars has a key that is not a valid variable name",
    )
    lo, hi = e.min_replicas, e.max_replicas
    _check(lo is None or lo >= 0, f"{p}.min_replicas must be >= 0")
    _check(hi is None or hi >= 1, f"{p}.max_replicas must be >= 1")
    _check(lo is None or hi is None or lo <= hi, f"{p}.min_replicas ({lo}) must be <= max_replicas ({hi})")
    _check(
        lo is None or (lo == 0) == e.scale_to_zero_enabled,
        f"{p}.min_replicas must be 0 exactly when scale_to_zero_enabled is true",
    )
    _check(e.max_concurrency is None or e.max_concurrency >= 1, f"{p}.max_concurrency must be >= 1")
    try:
        scaling_config(e)
    except ScalingConfigError as exc:
        raise invalid_parameter(f"{p}.autoscaling.{exc.field}: {str(exc).split(': ', 1)[-1]}"[:500]) from None
    return e.model_copy(update={"name": name, "entity_version": version, "resolved_version": resolved})


def _normalize_traffic(traffic: TrafficConfig | None, names: list[str]) -> TrafficConfig:
    if traffic is None:
        _check(len(names) == 1, "traffic_config is required with several served entities")
        return TrafficConfig(routes=[Route(served_entity_name=names[0], traffic_percentage=100)])
    routes: list[Route] = []
    seen: dict[str, int] = {}
    for i, r in enumerate(traffic.routes):
        p = f"traffic_config.routes[{i}]"
        both = (r.served_entity_name, r.served_model_name)
        _check(None in both or both[0] == both[1], f"{p}: served_entity_name and served_model_name differ")
        target = r.served_entity_name or r.served_model_name or ""
        _check(bool(target), f"{p}.served_entity_name is required")
        _check(target in names, f"{p} names no served entity of this config")
        _check(target not in seen, f"{p} routes to the same served entity as routes[{seen.get(target)}]")
        _check(0 <= r.traffic_percentage <= 100, f"{p}.traffic_percentage must be between 0 and 100")
        seen[target] = i
        routes.append(Route(served_entity_name=target, traffic_percentage=r.traffic_percentage))
    total = sum(r.traffic_percentage for r in routes)
    _check(total == 100, f"traffic_config: traffic percentages sum to {total}, not 100")
    return TrafficConfig(routes=routes)


def normalize_config(config: EndpointCoreConfig, endpoint_name: str | None = None) -> EndpointCoreConfig:
    """Check a config and fill defaults (entity names, traffic) into a new config; idempotent.

    Pinned entities get ``resolved_version = entity_version``; alias entities keep theirs (None until resolved).
    """
    _check(endpoint_name is None or config.name in (None, endpoint_name), "config.name must be the endpoint name")
    _check(
        1 <= len(config.served_entities) <= MAX_SERVED_ENTITIES,
        f"served_entities must list 1 to {MAX_SERVED_ENTITIES} entities",
    )
    entities = [_normalize_entity(i, e) for i, e in enumerate(config.served_entities)]
    first: dict[str, int] = {}
    for i, e in enumerate(entities):
        assert e.name is not None
        _check(e.name not in first, f"served_entities[{i}].name duplicates served_entities[{first.get(e.name)}].name")
        first[e.name] = i
    traffic = _normalize_traffic(config.traffic_config, list(first))
    if config.monitoring is not None:
        check_monitoring(config.monitoring)
    if config.stream_inputs is not None:
        check_stream_inputs(config.stream_inputs)
    streams = config.stream_inputs or None  # an empty list is no stream input
    return config.model_copy(update={"served_entities": entities, "traffic_config": traffic, "stream_inputs": streams})


DEFAULT_MAX_REPLICAS = 4  # local processes on one machine; set max_replicas for more
_ENTITY_LEVEL = ("min_replicas", "max_replicas", "scale_to_zero")


def scaling_config(e: ServedEntityInput, *, stored: bool = False) -> ScalingConfig:
    """The autoscaler's config for a served entity: the Databricks-level fields (min/max replicas,
    scale_to_zero_enabled, max_concurrency) plus its ``autoscaling`` block. A fixed ``max_concurrency``
    turns the vertical axis off and sets the per-replica target from it. ``stored``: a config accepted
    before a field was removed (``config.REMOVED``) rolls out without it, with a warning, where a new
    request naming it is refused."""
    extra = dict(e.autoscaling or {})
    for key in sorted(set(extra) & set(REMOVED) if stored else ()):
        log.warning("served entity %s: autoscaling.%s is no longer a setting, ignored: %s", e.name, key, REMOVED[key])
        del extra[key]
    for key in _ENTITY_LEVEL:
        if key in extra:
            raise ScalingConfigError(key, "set it on the served entity, not in autoscaling")
    base: dict[str, Any] = {
        "min_replicas": e.min_replicas if e.min_replicas is not None else (0 if e.scale_to_zero_enabled else 1),
        "max_replicas": e.max_replicas
        if e.max_replicas is not None
        else max(DEFAULT_MAX_REPLICAS, e.min_replicas or 0),
        "scale_to_zero": e.scale_to_zero_enabled,
    }
    if e.max_concurrency is not None and "initial_target" not in extra:
        headroom = float(extra.get("admission_headroom", 1.5))
        target = max(1.0, e.max_concurrency / headroom)
        base.update(
            vertical=False,
            initial_target=target,
            min_target=min(target, float(extra.get("min_target", 1.0))),
            max_target=max(target, float(extra.get("max_target", 1024.0))),
        )
    return ScalingConfig.from_mapping({**base, **extra})


def traffic_weights(config: EndpointCoreConfig) -> list[tuple[str, int]]:
    """(served entity name, percentage) for each entity of a normalized config, in entity order."""
    if config.traffic_config is None or any(e.name is None for e in config.served_entities):
        raise ValueError("traffic_weights needs a normalized config")
    percent = {r.served_entity_name or r.served_model_name: r.traffic_percentage for r in config.traffic_config.routes}
    return [(e.name, percent.get(e.name, 0)) for e in config.served_entities if e.name is not None]


@dataclass
class EndpointRecord:
    """The persisted state of one endpoint. ``revision`` is the store's row version, not JSON."""

    name: str
    id: str
    creator: str
    created_ms: int
    updated_ms: int
    config: EndpointCoreConfig
    config_version: int = 1
    ready: str = "NOT_READY"
    config_update: str = "IN_PROGRESS"
    pending_config: EndpointCoreConfig | None = None
    ai_gateway: dict[str, Any] | None = None
    state_message: str | None = None
    tags: list[dict[str, str]] = field(default_factory=list)
    description: str | None = None
    revision: int = 0

    def __post_init__(self) -> None:
        if self.ready not in READY_STATES or self.config_update not in CONFIG_UPDATE_STATES:
            raise ValueError("unknown endpoint state")

    def to_json(self) -> str:
        data = asdict(self)  # asdict leaves the pydantic models as they are
        del data["revision"]
        for key in ("config", "pending_config"):
            data[key] = data[key] and data[key].model_dump(mode="json", exclude_none=True)
        return json.dumps({"format": 1, **data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, revision: int = 0) -> EndpointRecord:
        data = json.loads(text)
        data.pop("format", None)
        for key in ("config", "pending_config"):
            data[key] = data.get(key) and EndpointCoreConfig.model_validate(data[key], context=TRUSTED_CONTEXT)
        return cls(**data, revision=revision)


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
    entity, model = {**common, "entity_name": e.entity_name}, {**common, "model_name": e.entity_name}
    version = e.resolved_version or e.entity_version
    if version is not None:
        entity["entity_version"] = model["model_version"] = version
    extensions = ("entity_alias", "min_replicas", "max_replicas", "max_concurrency", "autoscaling")
    entity.update({k: getattr(e, k) for k in extensions if getattr(e, k) is not None})
    return entity, model


def _config_view(config: EndpointCoreConfig, version: int, state: dict[str, str]) -> dict[str, Any]:
    views = [_entity_views(e, state) for e in config.served_entities]
    routes = [
        {"served_entity_name": n, "served_model_name": n, "traffic_percentage": pct}
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
        "config": _config_view(record.config, record.config_version, _deployment(record, pending=False)),
    }
    if record.pending_config is not None:
        pending = _config_view(record.pending_config, record.config_version + 1, _deployment(record, pending=True))
        view["pending_config"] = {**pending, "start_time": record.updated_ms}
    for key in ("ai_gateway", "tags", "description"):
        if getattr(record, key):
            view[key] = getattr(record, key)
    if record.state_message:
        # tollfree extension: why the last rollout failed, even while the old config keeps serving
        view["state_message"] = record.state_message
    return view
