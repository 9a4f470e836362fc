"""Serving-endpoint requests, configs and records in Databricks ``/api/2.0/serving-endpoints`` shapes.

Inputs take what databricks-sdk and MLflow send for registry models on CPU, plus tollfree extensions
(``entity_alias``, ``min/max_replicas``, ``max_concurrency``, ``autoscaling``, a route's ``shadow_percentage``,
and on the config ``response_cache``, ``monitoring`` and ``stream_inputs``); other fields are a 400 naming them.
These are the types only: ``validation`` checks a config and fills its defaults, ``views`` renders a record as
Databricks returns it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from serving.endpoints.external import ExternalModelInput
from serving.endpoints.monitoring_settings import MonitoringConfig
from serving.streams.config import StreamInput

READY_STATES = frozenset({"READY", "NOT_READY"})
CONFIG_UPDATE_STATES = frozenset({"NOT_UPDATING", "IN_PROGRESS", "UPDATE_FAILED", "UPDATE_CANCELED"})
MAX_SERVED_ENTITIES = 15
TRUSTED_CONTEXT = {"tollfree_trusted": True}  # model_validate context for data from our own store
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
    # tollfree extension: a shadow (traffic_percentage 0) that is sent a copy of this share of the endpoint's
    # requests after each client's answer; its answers go to the inference log marked shadow, never to a client
    shadow_percentage: StrictInt | None = None


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
    monitoring: MonitoringConfig | None = None  # tollfree extension: serving.endpoints.monitoring_settings
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


def registry_entities(config: EndpointCoreConfig) -> list[ServedEntityInput]:
    """The entities that serve a registry model on replicas (all but the external models)."""
    return [e for e in config.served_entities if e.external_model is None]


def shadow_shares(config: EndpointCoreConfig) -> tuple[tuple[str, int], ...]:
    """(served entity name, shadow percentage) for each shadow of a normalized config."""
    routes = config.traffic_config.routes if config.traffic_config is not None else []
    return tuple(
        (str(r.served_entity_name or r.served_model_name), r.shadow_percentage) for r in routes if r.shadow_percentage
    )


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
