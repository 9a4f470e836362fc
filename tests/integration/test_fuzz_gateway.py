"""Schemathesis against the gateway's own OpenAPI, in-process over ASGI: no generated input gets a 5xx.

The schema is the one the gateway serves at ``/openapi.json`` (fetched with a token: it is not public),
plus the data plane's routes, which live outside FastAPI's routing and so outside that document: the
invocations route (a scoring body or a chat body), the OpenAI-compatible chat route and the Open Inference
Protocol's routes (their model ``ep`` takes one double column ``x``; their errors are ``{"error"}``). The gateway's
scoring replicas are a seam that answers every request (the real replica's parser is fuzzed by
``tests/unit/test_fuzz_scoring.py``); its registry holds no model, so every create is refused at resolution
and nothing starts a process. Endpoint ``chat`` serves an external chat model, a real HTTP server on
loopback that answers any chat request as an OpenAI-compatible server does (whole or streamed), and so
does ``ep``'s replica to a chat body. Every operation is fuzzed with the admin token (to get past
authentication into validation and the handlers) and its responses must all be < 500 and in the
``{"error_code", "message"}`` shape when they are errors.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from serving.gateway.auth import Tokens
from serving.gateway.oip_plane import ModelSchemas
from serving.protocol.columns import Column, ModelIO
from tests.fakes import in_process_gateway, no_registry

ADMIN = "fuzz-admin-token-" + secrets.token_hex(8)

EXAMPLES = int(os.environ.get("TOLLFREE_FUZZ_EXAMPLES", "40"))
ENDPOINTS = ["ep", "chat"]  # a scoring endpoint and an external chat model's; any other name is a 404 elsewhere
SCORING_BODY = {
    "type": "object",
    "properties": {
        "dataframe_records": {"type": "array", "items": {"type": "object"}},
        "dataframe_split": {"type": "object"},
        "instances": {"type": "array"},
        "inputs": {},
        "params": {"type": "object"},
    },
}
MESSAGE = {
    "type": "object",
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "wizard"]},
        "content": {"type": "string"},
    },
    "required": ["role", "content"],
}
# Typed as the OpenAI API types them, so that many generated bodies pass the checks and reach the model; the
# values (a negative max_tokens, a temperature of 9, a role of "wizard") still go out of range.
CHAT_BODY = {
    "type": "object",
    "properties": {
        "messages": {"type": "array", "items": MESSAGE, "minItems": 1},
        "max_tokens": {"type": "integer"},
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "stream": {"type": "boolean"},
        "stop": {"type": "string"},
        "n": {"type": "integer"},
        "stream_options": {"type": "object"},
    },
    "required": ["messages"],
}
INVOCATIONS_PATH = {
    "post": {
        "operationId": "invocations",
        "parameters": [
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": ENDPOINTS}}
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"anyOf": [SCORING_BODY, CHAT_BODY]}}},
        },
        "responses": {"200": {"description": "predictions, or a chat completion"}},
    }
}
OPENAI_PATH = {
    "post": {
        "operationId": "chat_completions",
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        **CHAT_BODY,
                        "properties": {
                            **CHAT_BODY["properties"],
                            "model": {"type": "string", "enum": [*ENDPOINTS, "nope"]},
                        },
                    }
                }
            },
        },
        "responses": {"200": {"description": "a chat completion"}},
    }
}


TENSOR = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "enum": ["x", "nope"]},
        "datatype": {
            "type": "string",
            "enum": ["BOOL", "INT8", "INT64", "UINT8", "FP16", "FP32", "FP64", "BYTES", "FP99"],
        },
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {},
        "parameters": {"type": "object"},
    },
    "required": ["name", "datatype", "shape"],
}
OIP_INFER_BODY = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "inputs": {"type": "array", "items": TENSOR},
        "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "parameters": {"type": "object"},
    },
}
MODEL_NAME = {
    "name": "name",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "enum": [*ENDPOINTS, "nope"]},
}
OIP_PATHS = {  # the Open Inference Protocol's REST routes (``serving.gateway.oip_plane``), data plane too
    "/v2": {"get": {"operationId": "oip_server", "responses": {"200": {"description": "server metadata"}}}},
    "/v2/health/ready": {"get": {"operationId": "oip_ready", "responses": {"200": {"description": "ready"}}}},
    "/v2/models/{name}": {
        "get": {
            "operationId": "oip_model",
            "parameters": [MODEL_NAME],
            "responses": {"200": {"description": "metadata"}},
        }
    },
    "/v2/models/{name}/ready": {
        "get": {
            "operationId": "oip_model_ready",
            "parameters": [MODEL_NAME],
            "responses": {"200": {"description": "ready"}},
        }
    },
    "/v2/models/{name}/infer": {
        "post": {
            "operationId": "oip_infer",
            "parameters": [MODEL_NAME],
            "requestBody": {"required": True, "content": {"application/json": {"schema": OIP_INFER_BODY}}},
            "responses": {"200": {"description": "output tensors"}},
        }
    },
}


def external_chat(base: str) -> dict:
    """Endpoint ``chat``'s one served entity: an external chat model at ``base``."""
    return {
        "name": "upstream",
        "external_model": {
            "name": "chat",
            "provider": "openai",
            "task": "llm/v1/chat",
            "openai_config": {"openai_api_key": "{{secrets/fuzz/key}}", "openai_api_base": base + "/v1"},
        },
    }


STREAM_INPUT = {  # as the API types it (serving.streams.config.StreamInput), so that many pass and reach its checks
    "type": "object",
    "properties": {
        "source": {"type": "string"},
        "sink": {"type": "string"},
        "dead_letter": {"type": "string"},
        "group": {"type": "string"},
        "batch_size": {"type": "integer"},
        "max_wait_ms": {"type": "integer"},
        "max_lag_s": {"type": "number"},
    },
}


def stream_config_path(entity: dict) -> dict:
    """The config route once more, for endpoint ``chat`` with its served entity: the stream inputs are what varies."""
    return {
        "put": {
            "operationId": "stream_inputs",
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "served_entities": {
                                    "type": "array",
                                    "items": {"const": entity},
                                    "minItems": 1,
                                    "maxItems": 1,
                                },
                                "stream_inputs": {"type": "array", "items": STREAM_INPUT},
                            },
                            "required": ["served_entities", "stream_inputs"],
                        }
                    }
                },
            },
            "responses": {"200": {"description": "the endpoint"}},
        }
    }


COMPLETION = {
    "id": "chatcmpl-fuzz",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class _ChatServer(BaseHTTPRequestHandler):
    """An OpenAI-compatible server that answers any chat request: whole, or as server-sent events."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            stream = json.loads(body).get("stream") is True
        except (ValueError, AttributeError):
            stream = False
        if stream:
            chunk = {
                **COMPLETION,
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": "ok"}}],
            }
            out = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            kind = "text/event-stream"
        else:
            out, kind = json.dumps(COMPLETION).encode(), "application/json"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args) -> None:  # type: ignore[no-untyped-def]
        pass


@pytest.fixture(scope="module")
def chat_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ChatServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


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
def fuzzed(tmp_path_factory, chat_server):  # type: ignore[no-untyped-def]
    home = tmp_path_factory.mktemp("fuzz-gateway")
    (home / "secrets" / "fuzz").mkdir(parents=True)
    (home / "secrets" / "fuzz" / "key").write_text("upstream-key")
    tokens = Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN})
    schemas = ModelSchemas(home, read=lambda uri, home: ModelIO((Column("x", "double"),), ()))
    app = without_lifespan(
        in_process_gateway(
            home, tokens, resolve=no_registry, max_body_bytes=64 * 1024, replica_url=chat_server, model_schemas=schemas
        )
    )
    with TestClient(app) as client:  # the external chat endpoint, created as a user would
        created = client.post(
            "/api/2.0/serving-endpoints",
            headers={"Authorization": f"Bearer {ADMIN}"},
            json={"name": "chat", "config": {"served_entities": [external_chat(chat_server)]}},
        )
        assert created.status_code == 200, created.text
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app, headers={"Authorization": f"Bearer {ADMIN}"})
    raw = dict(loaded.raw_schema)
    raw["paths"] = {
        **raw["paths"],
        "/serving-endpoints/{name}/invocations": INVOCATIONS_PATH,
        "/serving-endpoints/chat/completions": OPENAI_PATH,
        "/api/2.0/serving-endpoints/chat/config": stream_config_path(external_chat(chat_server)),
        **OIP_PATHS,
    }
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = app
    return schema


def test_the_fuzzed_schema_covers_both_planes(fuzzed):
    operations = {(op.ok().method.upper(), op.ok().path) for op in fuzzed.get_all_operations()}
    assert ("POST", "/api/2.0/serving-endpoints") in operations
    assert ("PUT", "/api/2.0/serving-endpoints/{name}/config") in operations
    assert ("POST", "/serving-endpoints/{name}/invocations") in operations
    assert ("POST", "/serving-endpoints/chat/completions") in operations
    assert ("PUT", "/api/2.0/serving-endpoints/chat/config") in operations
    assert ("POST", "/v2/models/{name}/infer") in operations
    assert len(operations) >= 18


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
        shape = {"error_code", "message"}
        if case.path.startswith("/v2"):  # the Open Inference Protocol's error, or a model's "not ready" answer
            shape = {"name", "ready"} if case.path.endswith("/ready") and "ready" in body else {"error"}
        if set(body) != shape:
            failures.append(
                f"{label} -> {response.status_code} with a body not in the error shape: {response.text[:200]}"
            )


def _fuzz(operation, label: str, seen: dict[str, set[int]], failures: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Every example hypothesis generates for one operation, sent with the admin token."""

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy())
    def run(case):  # type: ignore[no-untyped-def]
        response = case.call(headers={"Authorization": f"Bearer {ADMIN}"})
        seen.setdefault(label, set()).add(response.status_code)
        _check(label, response, case, failures)

    run()


CHAT_ROUTES = ("/serving-endpoints/{name}/invocations", "/serving-endpoints/chat/completions")


@pytest.mark.slow
def test_no_generated_request_gets_a_5xx(fuzzed):
    failures: list[str] = []
    seen: dict[str, set[int]] = {}  # operation -> the statuses it answered
    for result in fuzzed.get_all_operations():
        operation = result.ok()
        _fuzz(operation, f"{operation.method.upper()} {operation.path}", seen, failures)
    assert not failures, "\n".join(failures[:20])
    assert len(seen) >= 18, seen
    # the new routes' checks were reached: each refused some generated requests, naming what is wrong
    for operation in (
        "PUT /api/2.0/serving-endpoints/chat/config",
        "POST /v2/models/{name}/infer",
        *(f"POST {route}" for route in CHAT_ROUTES),
    ):
        assert any(400 <= s < 500 for s in seen[operation]), (operation, seen[operation])


def test_a_valid_chat_request_on_each_route_reaches_the_chat_server(fuzzed):
    """What the fuzzed requests reach once they pass the checks: the chat server's answer, whole or streamed (sent
    as the fuzzer sends its cases)."""
    hello = [{"role": "user", "content": "hi"}]
    invocations = fuzzed["/serving-endpoints/{name}/invocations"]["POST"]
    completions = fuzzed["/serving-endpoints/chat/completions"]["POST"]
    cases = [
        invocations.Case(path_parameters={"name": "chat"}, body={"messages": hello}),
        invocations.Case(path_parameters={"name": "ep"}, body={"messages": hello, "stream": True}),
        completions.Case(body={"model": "chat", "messages": hello}),
    ]
    answers = [case.call(headers={"Authorization": f"Bearer {ADMIN}"}) for case in cases]
    assert [a.status_code for a in answers] == [200, 200, 200], [a.text[:200] for a in answers]
    assert answers[0].json()["choices"][0]["message"]["content"] == "ok"
    assert answers[1].text.startswith("data: ") and "[DONE]" in answers[1].text
