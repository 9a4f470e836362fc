"""Generates reference/http-api.md and reference/openapi.json from the gateway's own route table (run by
mkdocs-gen-files).

The gateway's FastAPI app serves an OpenAPI document at ``/openapi.json`` for its control plane; the data plane
(invocations, the OpenAI-compatible route, the Open Inference Protocol's routes) is plain ASGI in front of it,
outside that document. So the page lists every route from both: the control plane's from
``serving.gateway.control_plane.install``, the data plane's from the patterns ``serving.gateway.app.Gateway``
matches and ``serving.gateway.oip_plane.ROUTES``, and each route's auth from the same sets the gateway checks; the
edge routes from ``serving.edge.api.ROUTES``."""

from __future__ import annotations

import inspect
import json

import mkdocs_gen_files
from fastapi import FastAPI
from fastapi.routing import APIRoute

from serving.edge.api import PREFIX as EDGE_PREFIX
from serving.edge.api import ROUTES as EDGE_ROUTES
from serving.gateway import app as gateway_app
from serving.gateway import control_plane
from serving.gateway.chat_plane import OPENAI_ROUTE
from serving.gateway.data_plane import InvocationsHandler
from serving.gateway.oip_plane import ROUTES as OIP_ROUTES
from serving.protocol.scoring import INPUT_KEYS

INVOCATIONS_PATH = "/serving-endpoints/{name}/invocations"


def auth(method: str, path: str) -> str:
    """Who may call it, by the rules of ``Gateway.__call__``."""
    if path in gateway_app.PUBLIC_PATHS:
        return "none"
    if method in gateway_app.READ_METHODS and path not in gateway_app.ADMIN_ONLY_READS:
        return "any token with a right to the endpoint" if "{name}" in path else "any token"
    return "admin token"


def first_paragraph(text: str | None) -> str:
    return " ".join(inspect.cleandoc(text or "").split("\n\n")[0].split()).replace("|", "\\|")


def control_routes() -> tuple[list[tuple[str, str, str, str, str]], dict]:
    app = FastAPI(title="tollfree gateway", docs_url=None, redoc_url=None)
    control_plane.install(app)
    schema = app.openapi()
    rows = []
    for route in app.routes:
        if not isinstance(route, APIRoute):
            continue
        for method in sorted(route.methods):
            operation = schema["paths"].get(route.path, {}).get(method.lower(), {})
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            body_name = body.get("$ref", "").rsplit("/", 1)[-1]
            what = first_paragraph(route.endpoint.__doc__) or route.summary or route.name.replace("_", " ")
            rows.append((method, route.path, auth(method, route.path), f"`{body_name}`" if body_name else "-", what))
    rows.append(("GET", "/openapi.json", auth("GET", "/openapi.json"), "-", "this control plane's OpenAPI document"))
    return rows, schema


def data_routes() -> list[tuple[str, str, str, str, str]]:
    keys = ", ".join(f"`{k}`" for k in INPUT_KEYS)
    invocations = f"score rows (the MLflow scoring protocol: one of {keys}), or a chat request on a chat endpoint"
    return [
        ("POST", INVOCATIONS_PATH, "any token with a right to the endpoint", "-", invocations),
        (
            "POST",
            OPENAI_ROUTE,
            "any token with a right to the endpoint named by `model`",
            "-",
            first_paragraph(InvocationsHandler.openai.__doc__).split(": ", 1)[-1],  # after the route's own name
        ),
        *((method, path, who, "-", f"Open Inference Protocol: {what}") for method, path, who, what in OIP_ROUTES),
    ]


def table(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
    lines = ["| method | path | auth | body | what |", "| --- | --- | --- | --- | --- |"]
    return lines + [f"| {m} | `{p}` | {a} | {b} | {w} |" for m, p, a, b, w in rows]


def edge_routes() -> list[tuple[str, str, str, str, str]]:
    return [(method, f"{EDGE_PREFIX}{path}", who, "-", what) for method, path, _, who, what in EDGE_ROUTES]


def page(control: list, data: list, edge: list) -> str:
    lines = [
        "# HTTP API",
        "",
        "Every route of the gateway, generated from its route table (`serving/gateway/control_plane.py`,",
        "`serving/gateway/app.py`). A token is a bearer token (`Authorization: Bearer ...`): the admin token",
        "(`TOLLFREE_TOKEN`) or a scoped one from `TOLLFREE_TOKENS_FILE`, which reaches only its endpoints.",
        "With `--admin-port`, the control plane listens only there and the public port has the data plane and",
        'the probes alone. Errors are `{"error_code", "message"}`; on the Open Inference Protocol\'s routes',
        '`{"error"}` ([how-to](../how-to/open-inference-protocol.md)).',
        "",
        "## Data plane",
        "",
        *table(data),
        "",
        "## Control plane",
        "",
        "The Databricks serving-endpoints API (what `databricks-sdk` calls) and tollfree's extensions. Its OpenAPI",
        "document, as the gateway serves it at `/openapi.json`: [openapi.json](openapi.json). An endpoint's own",
        "OpenAPI document (its invocations' schema, as Databricks serves it) comes from",
        "`GET /api/2.0/serving-endpoints/{name}/openapi` (`serving/endpoints/openapi.py`).",
        "",
        *table(control),
        "",
        "## Edge devices",
        "",
        "The routes edge devices poll and operators drive ([edge serving](../how-to/edge-serving.md),",
        "`serving/edge/api.py`). A device's token is the one its registration answered; the device routes are on",
        "the public port too.",
        "",
        *table(edge),
    ]
    return "\n".join(lines) + "\n"


control, schema = control_routes()
with mkdocs_gen_files.open("reference/http-api.md", "w") as out:
    out.write(page(control, data_routes(), edge_routes()))
with mkdocs_gen_files.open("reference/openapi.json", "w") as out:
    json.dump(schema, out, indent=1)
