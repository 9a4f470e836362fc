"""Generates reference/oip-conformance.md from reference/oip-conformance.json, the matrix the run of
tests/e2e/test_oip.py makes (mkdocs-gen-files): every REST route and gRPC method of the Open Inference Protocol by
every official client and mode, as the test run found them."""

from __future__ import annotations

import json
from pathlib import Path

import mkdocs_gen_files

SOURCE = Path(__file__).resolve().parents[1] / "reference" / "oip-conformance.json"


def page(doc: dict) -> str:
    clients = ", ".join(f"{name} {version}" for name, version in doc["clients"].items())
    lines = [
        "# Open Inference Protocol conformance",
        "",
        "Every REST route and gRPC method of the Open Inference Protocol, called by the protocol's official clients",
        "unchanged, in each of their modes, against a gateway serving two models: a model with double, long, boolean",
        "and string columns, and the demo model (which reads its features online). A call passes when it succeeds",
        "and, for inference, gives the same predictions as the MLflow scoring route for the same rows.",
        "*not offered*: the client has no call for that route or method; *-*: the other protocol.",
        "",
        f"Clients: {clients}. Made by `{doc['command']}` on {doc['date']} at commit `{doc['commit']}`; every run of",
        "the suite checks that the matrix still holds (tests/e2e/test_oip.py) and fails if a cell changed.",
        "",
        "| Protocol | Route or method | " + " | ".join(doc["columns"]) + " |",
        "|---|---|" + "---|" * len(doc["columns"]),
    ]
    for row in doc["rows"]:
        lines.append(f"| {row['protocol']} | `{row['operation']}` | " + " | ".join(row["cells"]) + " |")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("reference/oip-conformance.md", "w") as out:
    out.write(page(json.loads(SOURCE.read_text())))
