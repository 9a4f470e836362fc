"""Promotion policies: one YAML file per model (the promote flow's are in ``flows/promotion_policies/``), checked
before anything runs.

An unknown gate, an unknown key or a missing threshold is refused with the file and line named.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# gate -> (required keys, optional keys); a required key with a dict value is a mapping of name -> number
GATE_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "quality": (frozenset({"min"}), frozenset({"vs_champion"})),
    "latency": (frozenset({"p50_ms", "p99_ms"}), frozenset({"requests", "concurrency", "probes"})),
    "fairness": (frozenset({"attribute", "max_gap"}), frozenset({"rate", "score_threshold", "min_group_rows"})),
    "cost": (frozenset({"artifact_mb", "peak_rss_mb", "cpu_ms_per_prediction"}), frozenset({"probes"})),
    "data": (frozenset({"require_success"}), frozenset()),
    "compatibility": (frozenset(), frozenset({"require_signature"})),
}
TOP_KEYS = frozenset({"model", "endpoint", "feature_service", "bootstrap_champion", "gates"})
NUMERIC = {
    "p50_ms",
    "p99_ms",
    "requests",
    "concurrency",
    "probes",
    "max_gap",
    "score_threshold",
    "min_group_rows",
    "artifact_mb",
    "peak_rss_mb",
    "cpu_ms_per_prediction",
}
RATES = frozenset({"false_positive_rate", "true_positive_rate", "flag_rate"})


class PromotionPolicyError(ValueError):
    """A policy file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class PromotionPolicy:
    path: Path
    model: str
    endpoint: str | None
    feature_service: str | None
    bootstrap_champion: bool
    gates: dict[str, dict[str, Any]]


def _fail(path: Path, node: yaml.Node, message: str) -> PromotionPolicyError:
    return PromotionPolicyError(f"promotion policy {path} line {node.start_mark.line + 1}: {message}")


def _mapping(path: Path, node: yaml.Node, what: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(path, node, f"{what} must be a mapping")
    return {k.value: (k, v) for k, v in node.value}


def _number(path: Path, node: yaml.Node, what: str) -> float:
    value = yaml.safe_load(yaml.serialize(node))
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, node, f"{what} must be a number")
    return float(value)


def _check_gate(path: Path, name: str, key_node: yaml.Node, node: yaml.Node) -> dict[str, Any]:
    if name not in GATE_KEYS:
        raise _fail(path, key_node, f"unknown gate {name!r} (known: {', '.join(sorted(GATE_KEYS))})")
    required, optional = GATE_KEYS[name]
    entries = (
        _mapping(path, node, f"gate {name}")
        if not (isinstance(node, yaml.ScalarNode) and node.value in ("", "null"))
        else {}
    )
    for key, (k, _) in entries.items():
        if key not in required | optional:
            raise _fail(
                path, k, f"gate {name} has unknown setting {key!r} (allowed: {', '.join(sorted(required | optional))})"
            )
    for key in sorted(required - entries.keys()):
        raise _fail(path, key_node, f"gate {name} is missing its threshold {key!r}")
    for key, (k, v) in entries.items():
        if key in NUMERIC:
            number = _number(path, v, f"{name}.{key}")
            if key == "probes" and (number < 1 or number != int(number)):
                raise _fail(path, v, f"{name}.probes must be a whole number of at least 1")
        elif key == "min":
            for metric, (_, mv) in _mapping(path, v, f"{name}.min").items():
                _number(path, mv, f"{name}.min.{metric}")
        elif key == "vs_champion":
            sub = _mapping(path, v, f"{name}.vs_champion")
            for needed in ("metric", "max_drop"):
                if needed not in sub:
                    raise _fail(path, k, f"{name}.vs_champion is missing {needed!r}")
            _number(path, sub["max_drop"][1], f"{name}.vs_champion.max_drop")
        elif key == "rate" and v.value not in RATES:
            raise _fail(path, v, f"{name}.rate must be one of {', '.join(sorted(RATES))}")
    return yaml.safe_load(yaml.serialize(node)) or {}


def load_policy(path: Path) -> PromotionPolicy:
    """Parse and check a policy file; every error names the line."""
    path = Path(path)
    try:
        root = yaml.compose(path.read_text())
    except yaml.YAMLError as exc:
        raise PromotionPolicyError(f"promotion policy {path} is not valid YAML: {exc}") from exc
    if root is None:
        raise PromotionPolicyError(f"promotion policy {path} is empty")
    top = _mapping(path, root, "the policy")
    for key, (k, _) in top.items():
        if key not in TOP_KEYS:
            raise _fail(path, k, f"unknown key {key!r} (allowed: {', '.join(sorted(TOP_KEYS))})")
    if "model" not in top:
        raise _fail(path, root, "missing 'model'")
    if "gates" not in top:
        raise _fail(path, root, "missing 'gates'")
    gates = {name: _check_gate(path, name, k, v) for name, (k, v) in _mapping(path, top["gates"][1], "gates").items()}
    if not gates:
        raise _fail(path, top["gates"][1], "no gates declared")
    plain = yaml.safe_load(yaml.serialize(root))
    return PromotionPolicy(
        path,
        str(plain["model"]),
        plain.get("endpoint"),
        plain.get("feature_service"),
        bool(plain.get("bootstrap_champion", False)),
        gates,
    )


def policy_for(model_name: str, folder: Path) -> PromotionPolicy:
    """The policy of ``model_name``: ``folder/<model>.yaml``, checked, and refused if it is another model's."""
    path = folder / f"{model_name}.yaml"
    if not path.exists():
        raise PromotionPolicyError(f"no promotion policy for model {model_name!r}: expected {path}")
    policy = load_policy(path)
    if policy.model != model_name:
        raise PromotionPolicyError(f"promotion policy {path} is for model {policy.model!r}, not {model_name!r}")
    return policy
