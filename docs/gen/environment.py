"""Generates reference/environment.md from serving/settings.py's ENVIRONMENT table (run by mkdocs-gen-files)."""

from __future__ import annotations

import mkdocs_gen_files

from serving.settings import ENVIRONMENT

AREAS = {
    "all": "Every process",
    "gateway": "The gateway (`python -m serving`)",
    "kubernetes": "The gateway on Kubernetes (`TOLLFREE_BACKEND=kubernetes`)",
    "replica": "Replicas",
    "features": "Features (Feast)",
    "stack": "The local stack (`make up`)",
}


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def page() -> str:
    lines = [
        "# Environment variables",
        "",
        "Every `TOLLFREE_*` variable tollfree reads, generated from `ENVIRONMENT` in `serving/settings.py`",
        "(a unit test checks that the code reads exactly these). `MLFLOW_TRACKING_URI` defaults to",
        "`sqlite:///$TOLLFREE_HOME/mlflow.db`; telemetry of every library is switched off.",
    ]
    for area, title in AREAS.items():
        rows = [v for v in ENVIRONMENT if v.area == area]
        if not rows:
            continue
        lines += ["", f"## {title}", "", "| variable | default | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{v.name}` | {cell(v.default)} | {cell(v.meaning)} |" for v in rows]
    unknown = sorted({v.area for v in ENVIRONMENT} - set(AREAS))
    if unknown:
        raise ValueError(f"docs/gen/environment.py has no heading for the area(s) {unknown}")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("reference/environment.md", "w") as out:
    out.write(page())
