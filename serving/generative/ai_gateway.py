"""An endpoint's AI gateway config, in the shape Databricks' ``put_ai_gateway`` sends and GET returns.

What tollfree implements: per-minute call and token rate limits (per endpoint, or per token name as
``user`` / ``service_principal``), usage tracking, fallbacks, PII guardrails (NONE / BLOCK / MASK) and
the redaction patterns applied to payloads before the inference-log record is written
(``inference_table_config.redact``, a tollfree extension). What it does not is refused with a 400 naming
the field rather than accepted and ignored: ``user_group`` limits (tollfree tokens have no groups),
safety, keyword and topic guardrails. ``inference_table_config``'s Unity Catalog fields
(``enabled``, ``catalog_name``, ``schema_name``, ``table_name_prefix``) are type-checked, kept and
returned as given, for the SDK's round trip; they change nothing: tollfree writes every request to its
own inference log either way.

Error messages name the field and never echo the caller's values (unknown key names, cut to 64
characters, excepted: naming them is the point).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from serving.generative.redact import PATTERNS
from serving.protocol.errors import invalid_parameter

RATE_LIMIT_KEYS = ("endpoint", "user", "service_principal")  # user_group refused: tollfree tokens have no groups
PII_BEHAVIORS = ("NONE", "BLOCK", "MASK")
MAX_RATE_LIMITS = 20
MAX_PRINCIPAL_LENGTH = 256
_MAX_KEY_NAME = 64

_TOP_KEYS = ("usage_tracking_config", "rate_limits", "guardrails", "inference_table_config", "fallback_config")
_RATE_LIMIT_FIELDS = ("key", "calls", "tokens", "principal", "renewal_period")
_GUARDRAIL_FIELDS = ("pii", "safety", "invalid_keywords", "valid_topics")
_TABLE_FIELDS = ("enabled", "catalog_name", "schema_name", "table_name_prefix", "redact")


@dataclass(frozen=True)
class RateLimitRule:
    """One per-minute limit on calls and/or tokens."""

    key: str  # "endpoint" (one budget for the endpoint) | "user" / "service_principal" (one per token name)
    calls: int | None  # requests per minute
    tokens: int | None  # input + output tokens per minute
    principal: str | None  # the rule applies to this token name only
    renewal_period: str = "minute"


@dataclass(frozen=True)
class AiGatewayConfig:
    """What tollfree keeps of an endpoint's AI gateway settings."""

    rate_limits: tuple[RateLimitRule, ...] = ()
    usage_tracking: bool = False
    fallbacks: bool = False
    input_pii: str = "NONE"  # NONE | BLOCK | MASK
    output_pii: str = "NONE"
    redact: tuple[str, ...] = ()  # pattern names applied to payloads before the inference-log record is written
    inference_table: tuple[tuple[str, Any], ...] = ()  # its Unity Catalog fields as given (returned, not used)


def _object(value: Any, path: str, accepted: tuple[str, ...]) -> Mapping[str, Any]:
    """``value`` as a JSON object with only ``accepted`` keys; a 400 naming ``path`` otherwise."""
    if not isinstance(value, Mapping):
        raise invalid_parameter(f"{path} must be an object")
    unknown = [str(k)[:_MAX_KEY_NAME] for k in value if k not in accepted]
    if unknown:
        names = ", ".join(repr(k) for k in sorted(unknown))
        raise invalid_parameter(f"{path} has unknown key(s) {names}; accepted: {', '.join(accepted)}")
    return value


def _bool(value: Any, path: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid_parameter(f"{path} must be a boolean")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_parameter(f"{path} must be a list")
    return value


def _positive_int(value: Any, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid_parameter(f"{path} must be a positive integer")
    return value


def _string(value: Any, path: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise invalid_parameter(f"{path} must be a string")
    return value


def _enabled(value: Any, path: str) -> bool:
    """``{"enabled": bool}`` (usage tracking, fallbacks); absent means off."""
    if value is None:
        return False
    return _bool(_object(value, path, ("enabled",)).get("enabled"), f"{path}.enabled")


def _rate_limit(value: Any, path: str) -> RateLimitRule:
    fields = _object(value, path, _RATE_LIMIT_FIELDS)
    key = fields.get("key")
    if key == "user_group":
        raise invalid_parameter(f"{path}.key user_group is not supported: tollfree tokens have no groups")
    if key not in RATE_LIMIT_KEYS:
        raise invalid_parameter(f"{path}.key is required and must be one of {', '.join(RATE_LIMIT_KEYS)}")
    period = fields.get("renewal_period")
    if period is not None and period != "minute":
        raise invalid_parameter(f'{path}.renewal_period must be "minute"')
    calls = _positive_int(fields.get("calls"), f"{path}.calls")
    tokens = _positive_int(fields.get("tokens"), f"{path}.tokens")
    if calls is None and tokens is None:
        raise invalid_parameter(f"{path} needs calls or tokens (or both)")
    principal = _string(fields.get("principal"), f"{path}.principal")
    if principal is not None:
        if key == "endpoint":
            raise invalid_parameter(f"{path}.principal is only allowed with key user or service_principal")
        if not principal or len(principal) > MAX_PRINCIPAL_LENGTH:
            raise invalid_parameter(f"{path}.principal must be a token name of 1 to {MAX_PRINCIPAL_LENGTH} characters")
    return RateLimitRule(key=key, calls=calls, tokens=tokens, principal=principal)


def _rate_limits(value: Any) -> tuple[RateLimitRule, ...]:
    items = _list(value, "rate_limits")
    if len(items) > MAX_RATE_LIMITS:
        raise invalid_parameter(f"rate_limits may hold at most {MAX_RATE_LIMITS} rules")
    return tuple(_rate_limit(item, f"rate_limits[{i}]") for i, item in enumerate(items))


def _guardrail(value: Any, path: str) -> str:
    """One side's guardrails: the PII behavior; safety, keywords and topics are refused when set."""
    if value is None:
        return "NONE"
    fields = _object(value, path, _GUARDRAIL_FIELDS)
    if _bool(fields.get("safety"), f"{path}.safety"):
        raise invalid_parameter(f"{path}.safety is not supported here: only pii guardrails are implemented")
    for name in ("invalid_keywords", "valid_topics"):
        items = _list(fields.get(name), f"{path}.{name}")
        if not all(isinstance(item, str) for item in items):
            raise invalid_parameter(f"{path}.{name} must be a list of strings")
        if items:
            raise invalid_parameter(f"{path}.{name} is not supported here: only pii guardrails are implemented")
    pii = fields.get("pii")
    if pii is None:
        return "NONE"
    behavior = _object(pii, f"{path}.pii", ("behavior",)).get("behavior")
    if behavior is None:
        return "NONE"
    if behavior not in PII_BEHAVIORS:
        raise invalid_parameter(f"{path}.pii.behavior must be one of {', '.join(PII_BEHAVIORS)}")
    return behavior


def _guardrails(value: Any) -> tuple[str, str]:
    if value is None:
        return "NONE", "NONE"
    fields = _object(value, "guardrails", ("input", "output"))
    return _guardrail(fields.get("input"), "guardrails.input"), _guardrail(fields.get("output"), "guardrails.output")


def _redact(value: Any) -> tuple[str, ...]:
    """``inference_table_config.redact``, in PATTERNS order without repeats; other fields type-checked only."""
    path = "inference_table_config"
    if value is None:
        return ()
    fields = _object(value, path, _TABLE_FIELDS)
    _bool(fields.get("enabled"), f"{path}.enabled")
    for name in ("catalog_name", "schema_name", "table_name_prefix"):
        _string(fields.get(name), f"{path}.{name}")
    names = _list(fields.get("redact"), f"{path}.redact")
    for i, name in enumerate(names):
        if name not in PATTERNS:
            raise invalid_parameter(f"{path}.redact[{i}] must be one of {', '.join(PATTERNS)}")
    return tuple(p for p in PATTERNS if p in names)


def parse_ai_gateway(body: Any) -> AiGatewayConfig:
    """The config from a ``put_ai_gateway`` body; a 400 ApiError naming the first bad field."""
    fields = _object(body, "request body", _TOP_KEYS)
    input_pii, output_pii = _guardrails(fields.get("guardrails"))
    return AiGatewayConfig(
        rate_limits=_rate_limits(fields.get("rate_limits")),
        usage_tracking=_enabled(fields.get("usage_tracking_config"), "usage_tracking_config"),
        fallbacks=_enabled(fields.get("fallback_config"), "fallback_config"),
        input_pii=input_pii,
        output_pii=output_pii,
        redact=_redact(fields.get("inference_table_config")),
        inference_table=_table_fields(fields.get("inference_table_config")),
    )


def _table_fields(value: Any) -> tuple[tuple[str, Any], ...]:
    """The checked Unity Catalog fields of ``inference_table_config`` that were set, in a fixed order."""
    if not isinstance(value, Mapping):
        return ()
    return tuple(
        (k, value[k])
        for k in ("enabled", "catalog_name", "schema_name", "table_name_prefix")
        if value.get(k) is not None
    )


def _rule_view(rule: RateLimitRule) -> dict[str, Any]:
    out: dict[str, Any] = {"key": rule.key}
    if rule.calls is not None:
        out["calls"] = rule.calls
    if rule.tokens is not None:
        out["tokens"] = rule.tokens
    if rule.principal is not None:
        out["principal"] = rule.principal
    out["renewal_period"] = rule.renewal_period
    return out


def ai_gateway_view(config: AiGatewayConfig) -> dict[str, Any]:
    """The Databricks-shaped JSON GET returns: only what is set; ``parse_ai_gateway`` reads it back."""
    out: dict[str, Any] = {}
    if config.usage_tracking:
        out["usage_tracking_config"] = {"enabled": True}
    if config.rate_limits:
        out["rate_limits"] = [_rule_view(rule) for rule in config.rate_limits]
    guardrails = {
        side: {"pii": {"behavior": behavior}}
        for side, behavior in (("input", config.input_pii), ("output", config.output_pii))
        if behavior != "NONE"
    }
    if guardrails:
        out["guardrails"] = guardrails
    if config.redact or config.inference_table:
        out["inference_table_config"] = {
            **dict(config.inference_table),
            **({"redact": list(config.redact)} if config.redact else {}),
        }
    if config.fallbacks:
        out["fallback_config"] = {"enabled": True}
    return out
