"""Config normalisation: a served-endpoint config checked and its defaults filled in.

Messages name fields and indexes, never payload values, except an endpoint name cut to 63 characters.
"""

from __future__ import annotations

import re

from serving.autoscaler.config import ScalingConfigError
from serving.endpoints.external import check_external
from serving.endpoints.monitoring_settings import check_monitoring
from serving.endpoints.scaling import scaling_config
from serving.endpoints.spec import (
    MAX_SERVED_ENTITIES,
    EndpointCoreConfig,
    Route,
    ServedEntityInput,
    TrafficConfig,
    quote_name,
)
from serving.protocol.errors import invalid_parameter
from serving.streams.config import check_stream_inputs

_ENDPOINT_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,63}$")
_SERVED_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*$")  # also Unity Catalog "a.b.c"
_ALIAS_RE = re.compile(r"^[A-Za-z0-9_-]{1,255}$")
_RESERVED_ALIAS_RE = re.compile(r"^(?:latest|[vV][0-9]+)$", re.IGNORECASE)  # as MLflow reserves
_VERSION_RE = re.compile(r"^[0-9]{1,18}$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


def validate_endpoint_name(name: str) -> str:
    if not isinstance(name, str) or not _ENDPOINT_NAME_RE.match(name):
        shown = quote_name(name) if isinstance(name, str) else "name"
        raise invalid_parameter(f"endpoint name {shown} is invalid: use 1 to 63 letters, digits, dashes or underscores")
    return name


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_parameter(message)


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


def _normalize_traffic(
    traffic: TrafficConfig | None, names: list[str], external: frozenset[str] = frozenset()
) -> TrafficConfig:
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
        shadow = r.shadow_percentage or None
        if shadow is not None:
            _check(0 < shadow <= 100, f"{p}.shadow_percentage must be between 0 and 100")
            _check(r.traffic_percentage == 0, f"{p}: a shadow takes no traffic (traffic_percentage must be 0)")
            _check(target not in external, f"{p}: an external model cannot be a shadow")
        seen[target] = i
        routes.append(
            Route(served_entity_name=target, traffic_percentage=r.traffic_percentage, shadow_percentage=shadow)
        )
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
    external = frozenset(str(e.name) for e in entities if e.external_model is not None)
    traffic = _normalize_traffic(config.traffic_config, list(first), external)
    if config.monitoring is not None:
        check_monitoring(config.monitoring)
    if config.stream_inputs is not None:
        check_stream_inputs(config.stream_inputs)
    streams = config.stream_inputs or None  # an empty list is no stream input
    return config.model_copy(update={"served_entities": entities, "traffic_config": traffic, "stream_inputs": streams})


def keep_extensions(update: EndpointCoreConfig, current: EndpointCoreConfig) -> EndpointCoreConfig:
    """A config update (``EndpointCoreConfig``) that leaves out a tollfree extension block (``monitoring``,
    ``stream_inputs``) keeps the current config's: the Databricks SDK's ``update_config`` cannot send them.
    Sent as ``null``, a block is removed."""
    kept = {key: getattr(current, key) for key in ("monitoring", "stream_inputs") if key not in update.model_fields_set}
    return update.model_copy(update=kept) if kept else update
