"""Generates reference/autoscaling.md from ScalingConfig's fields and FIELD_DOCS (run by mkdocs-gen-files)."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields

import mkdocs_gen_files

from serving.autoscaler.config import FIELD_DOCS, ScalingConfig
from serving.endpoints.scaling import DEFAULT_MAX_REPLICAS

ENTITY_LEVEL = {"min_replicas", "max_replicas", "scale_to_zero"}


def default(f) -> str:
    value = f.default if f.default is not MISSING else f.default_factory()
    if f.name == "max_replicas":
        return f"{DEFAULT_MAX_REPLICAS} (on the served entity)"
    if f.name == "min_replicas":
        return "1 (0 with scale to zero)"
    return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"


def page() -> str:
    missing = sorted({f.name for f in fields(ScalingConfig)} - set(FIELD_DOCS))
    if missing:
        raise ValueError(f"serving/autoscaler/config.py: FIELD_DOCS has no line for {missing}")
    lines = [
        "# Autoscaling settings",
        "",
        "A served entity's `autoscaling` object takes any field below but the first three, which are set on the",
        "served entity itself (`min_replicas`, `max_replicas`, `scale_to_zero_enabled`). A bad value is refused",
        "with a 400 naming the field. Generated from `ScalingConfig` and `FIELD_DOCS` in",
        "`serving/autoscaler/config.py`; how the policy uses them: [Autoscaling](../concepts/autoscaling.md).",
        "",
        "| field | type | default | meaning |",
        "| --- | --- | --- | --- |",
    ]
    ordered = sorted(fields(ScalingConfig), key=lambda f: f.name not in ENTITY_LEVEL)
    for f in ordered:
        kind = str(f.type).replace("tuple[str, ...]", "list of strings")
        meaning = FIELD_DOCS[f.name].replace("|", "\\|")
        lines.append(f"| `{f.name}` | {kind} | {default(f)} | {meaning} |")
    lines += [
        "",
        "A fixed `max_concurrency` on the served entity turns the vertical axis off and sets the per-replica",
        "target to `max_concurrency / admission_headroom` (at least 1).",
    ]
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("reference/autoscaling.md", "w") as out:
    out.write(page())
