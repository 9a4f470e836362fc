"""The Open Inference Protocol's conformance matrix: every REST route and gRPC method of the specification against
every official client and mode (``tests.e2e.oip_clients``), pass, fail or not offered by the client. The run of
``tests/e2e/test_oip.py`` makes it; the documentation's page is generated from the file it writes
(docs/gen/oip_conformance.py)."""

from __future__ import annotations

import datetime
import json
import subprocess
from importlib.metadata import version
from typing import Any

from serving.gateway.oip_plane import ROUTES
from serving.settings import PROJECT_DIR

PATH = PROJECT_DIR / "docs" / "reference" / "oip-conformance.json"
CLIENTS = ("tritonclient.http", "tritonclient.grpc", "kserve.rest", "kserve.grpc")
GRPC_METHODS = (
    "ServerLive",
    "ServerReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelMetadata (version)",
    "ModelReady",
    "ModelReady (version)",
    "ModelInfer",
    "ModelInfer (version)",
)
OPERATIONS = [("REST", f"{method} {path}") for method, path, _, _ in ROUTES] + [("gRPC", m) for m in GRPC_METHODS]
COMMAND = "TOLLFREE_WRITE_CONFORMANCE=1 make test PYTEST_ARGS='tests/e2e/test_oip.py -k official_client'"


def matrix(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The results (one per client, mode and operation, a model each) as rows of operations by columns of clients
    and modes."""
    columns = list(dict.fromkeys(f"{r['client']} ({r['mode']})" for r in results))
    outcome: dict[tuple[str, str], bool] = {}
    for r in results:
        key = (r["operation"], f"{r['client']} ({r['mode']})")
        outcome[key] = outcome.get(key, True) and r["passed"]
    unknown = {r["operation"] for r in results} - {operation for _, operation in OPERATIONS}
    if unknown:
        raise ValueError(f"operations the specification does not have: {sorted(unknown)}")
    rows = [
        {
            "protocol": protocol,
            "operation": operation,
            "cells": [_cell(outcome, protocol, operation, c) for c in columns],
        }
        for protocol, operation in OPERATIONS
    ]
    return {"columns": columns, "rows": rows}


def _cell(outcome: dict[tuple[str, str], bool], protocol: str, operation: str, column: str) -> str:
    if ("gRPC" if ".grpc" in column else "REST") != protocol:
        return "-"  # the other protocol's client
    if (operation, column) not in outcome:
        return "not offered"  # the client has no call for it
    return "pass" if outcome[operation, column] else "fail"


def cells(doc: dict[str, Any]) -> dict[tuple[str, str], str]:
    """What the matrix says, by operation and column: what a new run must repeat."""
    return {(row["operation"], c): cell for row in doc["rows"] for c, cell in zip(doc["columns"], row["cells"])}


def client_versions() -> dict[str, str]:
    return {name: version(name) for name in ("tritonclient", "kserve")}


def read() -> dict[str, Any]:
    return json.loads(PATH.read_text())


def write(doc: dict[str, Any], clients: dict[str, str]) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=PROJECT_DIR)
    PATH.write_text(
        json.dumps(
            {
                "command": COMMAND,
                "date": datetime.date.today().isoformat(),
                "commit": commit.stdout.strip() or "unknown",
                "clients": clients,
                **doc,
            },
            indent=1,
        )
        + "\n"
    )
