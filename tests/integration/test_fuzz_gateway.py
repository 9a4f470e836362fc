"""Schemathesis against the gateway's own OpenAPI, in-process over ASGI: no generated input gets a 5xx.

The schema is the one the gateway serves at ``/openapi.json`` (fetched with a token: it is not public),
plus the data plane's invocations route, which lives outside FastAPI's routing and so outside that
document. The gateway's replicas are a seam that answers every request (the real replica's parser is
fuzzed by ``tests/unit/test_fuzz_scoring.py``); its registry holds no model, so every create is
refused at resolution and nothing starts a process. Every operation is fuzzed with the admin token
(to get past authentication into validation and the handlers) and its responses must all be < 500
and in the ``{"error_code", "message"}`` shape when they are errors.
"""

from __future__ import annotations

import json
import os
import secrets

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from serving.gateway.auth import Tokens
from tests.fakes import in_process_gateway, no_registry

ADMIN = "fuzz-admin-token-" + secrets.token_hex(8)

EXAMPLES = int(os.environ.get("TOLLFREE_FUZZ_EXAMPLES", "40"))
INVOCATIONS_PATH = {
    "post": {
        "operationId": "invocations",
        "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "properties": {
                            "dataframe_records": {"type": "array", "items": {"type": "object"}},
                            "dataframe_split": {"type": "object"},
                            "instances": {"type": "array"},
                            "inputs": {},
                            "params": {"type": "object"},
                        },
                    }
                }
            },
        },
        "responses": {"200": {"description": "predictions"}},
    }
}


def without_lifespan(app):  # type: ignore[no-untyped-def]
    """The app with its lifespan answered and skipped: the fake replicas are not processes to stop."""

    async def asgi(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[-1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        await app(scope, receive, send)

    asgi.state = app.state  # type: ignore[attr-defined]
    return asgi


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("fuzz-gateway")
    tokens = Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN})
    app = without_lifespan(in_process_gateway(home, tokens, resolve=no_registry, max_body_bytes=64 * 1024))
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app, headers={"Authorization": f"Bearer {ADMIN}"})
    raw = dict(loaded.raw_schema)
    raw["paths"] = {**raw["paths"], "/serving-endpoints/{name}/invocations": INVOCATIONS_PATH}
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = app
    return schema


def test_the_fuzzed_schema_covers_both_planes(fuzzed):
    operations = {(op.ok().method.upper(), op.ok().path) for op in fuzzed.get_all_operations()}
    assert ("POST", "/api/2.0/serving-endpoints") in operations
    assert ("PUT", "/api/2.0/serving-endpoints/{name}/config") in operations
    assert ("POST", "/serving-endpoints/{name}/invocations") in operations
    assert len(operations) >= 11


def _check(label: str, response, case, failures: list[str]) -> None:  # type: ignore[no-untyped-def]
    """One generated request's answer: never a 5xx, and an error's JSON body in the Databricks error shape."""
    if response.status_code >= 500:
        failures.append(
            f"{label} -> {response.status_code}: {response.text[:200]} for {case.path_parameters} "
            f"{json.dumps(case.body, default=str)[:200] if case.body is not None else ''}"
        )
    elif response.status_code >= 400 and (response.headers.get("content-type") or [""])[0].startswith(
        "application/json"
    ):
        body = response.json()
        if set(body) != {"error_code", "message"}:
            failures.append(
                f"{label} -> {response.status_code} with a body not in the error shape: {response.text[:200]}"
            )


def _fuzz(operation, label: str, seen: dict[str, int], failures: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Every example hypothesis generates for one operation, sent with the admin token."""

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy())
    def run(case):  # type: ignore[no-untyped-def]
        seen[label] = seen.get(label, 0) + 1
        _check(label, case.call(headers={"Authorization": f"Bearer {ADMIN}"}), case, failures)

    run()


@pytest.mark.slow
def test_no_generated_request_gets_a_5xx(fuzzed):
    failures: list[str] = []
    seen: dict[str, int] = {}
    for result in fuzzed.get_all_operations():
        operation = result.ok()
        _fuzz(operation, f"{operation.method.upper()} {operation.path}", seen, failures)
    assert not failures, "\n".join(failures[:20])
    assert len(seen) >= 11 and all(n >= 1 for n in seen.values()), seen
