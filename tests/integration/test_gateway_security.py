"""Security of the gateway app, in-process: no one let in, nothing echoed, nothing logged, no one hogs it.

The gateway app runs in-process (fake replicas behind the dispatcher, a registry that holds no model) and
its routes are enumerated programmatically, so a route added later is covered without touching this
file. ``tests/e2e/test_security.py`` checks the same on a real gateway process with a real replica.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Route

from serving.gateway import auth
from serving.gateway.app import PUBLIC_PATHS
from serving.gateway.auth import Tokens
from tests.fakes import in_process_gateway, no_registry

ADMIN = "security-admin-token-" + secrets.token_hex(8)
SCOPED = "security-scoped-token-" + secrets.token_hex(8)  # may use endpoint "ep" only
LIMITED = "security-limited-token-" + secrets.token_hex(8)  # endpoint "ep", 1 request/s, burst 3
CANARY = "CANARY-" + secrets.token_hex(6)  # planted in payloads; must never come back


def _tokens(tmp_path: Path) -> Tokens:
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "app", "token": SCOPED, "endpoints": ["ep"]},
                    {
                        "name": "metered",
                        "token": LIMITED,
                        "endpoints": ["ep"],
                        "rate_limit": {"requests_per_second": 1, "burst": 3},
                    },
                ]
            }
        )
    )
    return Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN, "TOLLFREE_TOKENS_FILE": str(path)})


@pytest.fixture
def app(tmp_path):  # type: ignore[no-untyped-def]
    return in_process_gateway(tmp_path, _tokens(tmp_path), resolve=no_registry, max_body_bytes=64 * 1024)


@pytest.fixture
def client(app) -> Iterator[TestClient]:  # type: ignore[no-untyped-def]
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c
        app.state.manager.live.clear()  # no replica processes to stop


def every_route(app) -> list[tuple[str, str, bool]]:  # type: ignore[no-untyped-def]
    """(method, concrete path, names an endpoint) for every route the app serves, FastAPI's own included."""
    out = []
    for route in app.control.routes:
        if not isinstance(route, (APIRoute, Route)):
            continue
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            out.append((method, route.path.replace("{name}", "ep"), "{name}" in route.path))
    out.append(("POST", "/serving-endpoints/ep/invocations", True))  # the data plane, outside FastAPI's routing
    return out


def _call(client: TestClient, method: str, path: str, headers: dict[str, str]):  # type: ignore[no-untyped-def]
    body = {} if method in ("POST", "PUT") else None
    return client.request(method, path, json=body, headers=headers)


def test_the_route_enumeration_sees_the_whole_api(app):
    paths = {(m, p) for m, p, _ in every_route(app)}
    assert ("GET", "/openapi.json") in paths  # FastAPI's schema route is there and must be guarded too
    assert ("POST", "/api/2.0/serving-endpoints") in paths
    assert ("GET", "/metrics") in paths
    assert len(paths) >= 12


@pytest.mark.parametrize(
    "auth_header",
    [
        None,
        "",
        "Bearer",
        "Bearer wrong-token-0123456789abcdef",
        f"Basic {ADMIN}",
        f"Bearer {ADMIN}x",
        f"Bearer {ADMIN[:-1]}",
        f"Bearer  {ADMIN} extra",
    ],
    # ids without the tokens: the same on every run and worker, and no secret in a report
    ids=[
        "none",
        "empty",
        "bearer-alone",
        "wrong",
        "basic-admin",
        "admin-plus-one",
        "admin-minus-one",
        "admin-and-more",
    ],
)
def test_every_route_but_the_probes_refuses_a_missing_or_wrong_token(app, client, auth_header):
    headers = {"Authorization": auth_header} if auth_header is not None else {}
    checked = 0
    for method, path, _ in every_route(app):
        if path in PUBLIC_PATHS:
            continue
        reply = _call(client, method, path, headers)
        assert reply.status_code == 401, (method, path, reply.status_code, reply.text)
        assert reply.json()["error_code"] == "UNAUTHENTICATED"
        assert reply.headers["www-authenticate"] == "Bearer"
        checked += 1
    assert checked >= 12
    # paths no route serves give a stranger nothing to map the API with
    for path in ("/nope", "/api/2.0/serving-endpoints/ep/nope", "/docs", "/redoc", "/openapi.json"):
        assert client.get(path, headers=headers).status_code == 401, path


def test_only_the_probes_answer_without_a_token(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/.well-known/databricks-config").status_code == 404  # the SDK tolerates 404


def test_openapi_json_needs_a_token_and_is_served_with_one(client):
    assert client.get("/openapi.json").status_code == 401
    schema = client.get("/openapi.json", headers={"Authorization": f"Bearer {ADMIN}"})
    assert schema.status_code == 200 and "/api/2.0/serving-endpoints" in schema.json()["paths"]


def test_a_scoped_token_gets_no_admin_operation_and_no_other_endpoint(app, client):
    headers = {"Authorization": f"Bearer {SCOPED}"}
    admin_only = {
        ("POST", "/api/2.0/serving-endpoints"),
        ("PUT", "/api/2.0/serving-endpoints/ep/config"),
        ("DELETE", "/api/2.0/serving-endpoints/ep"),
        ("PUT", "/api/2.0/serving-endpoints/ep/ai-gateway"),
        ("GET", "/metrics"),
    }
    for method, path in admin_only:
        reply = _call(client, method, path, headers)
        assert reply.status_code == 403, (method, path, reply.text)
    for method, path, names_endpoint in every_route(app):
        if names_endpoint:
            other = (
                path.replace("/ep/", "/other/").replace("/ep", "/other")
                if path.endswith("/ep")
                else path.replace("/ep/", "/other/")
            )
            reply = _call(client, method, other, headers)
            assert reply.status_code == 403, (method, other, reply.text)
    listed = client.get("/api/2.0/serving-endpoints", headers=headers)
    assert listed.status_code == 200 and listed.json() == {"endpoints": []}  # sees only what it may access


def test_tokens_are_compared_in_constant_time_against_every_entry(tmp_path, monkeypatch):
    registry = _tokens(tmp_path)
    calls: list[tuple[bytes, bytes]] = []
    real = auth.hmac.compare_digest

    def counting(a, b):  # type: ignore[no-untyped-def]
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for token, expected in ((ADMIN, "admin"), (SCOPED, "app"), ("no-such-token-0123456789", None), ("x", None)):
        calls.clear()
        found = registry.lookup(token)
        assert (found.name if found else None) == expected
        assert len(calls) == 3, "every known token is compared, the match first or last or none"
        assert all(len(a) == len(b) == 32 for a, b in calls)  # digests: equal length whatever the token's
    assert ADMIN not in repr(registry) and SCOPED not in str(registry)


def test_tokens_are_never_logged(client, caplog):
    caplog.set_level(logging.DEBUG)
    for token in (ADMIN, SCOPED, LIMITED, "unknown-token-" + CANARY):
        headers = {"Authorization": f"Bearer {token}"}
        client.get("/api/2.0/serving-endpoints/other", headers=headers)
        client.post("/api/2.0/serving-endpoints", json={"name": "x"}, headers=headers)
        client.post("/serving-endpoints/other/invocations", content=b"{}", headers=headers)
    for secret in (ADMIN, SCOPED, LIMITED, CANARY):
        assert secret not in caplog.text


HOSTILE_CREATE_BODIES = [
    {"name": CANARY},
    {"name": f"ok-{CANARY}" * 4},
    {"name": "x", "config": {"served_entities": [{"entity_name": f"/etc/{CANARY}", "entity_version": "1"}]}},
    {"name": "x", "config": {"served_entities": [{"entity_name": "fraud", "entity_alias": CANARY + "/.."}]}},
    {"name": "x", "config": {"served_entities": [{"entity_name": "fraud", "entity_version": CANARY}]}},
    {
        "name": "x",
        "config": {"served_entities": [{"entity_name": "fraud", "entity_alias": "champion", "workload_size": CANARY}]},
    },
    {
        "name": "x",
        "config": {"served_entities": [{"entity_name": "fraud", "entity_alias": "champion", "min_replicas": CANARY}]},
    },
    {
        "name": "x",
        "config": {
            "served_entities": [
                {"entity_name": "fraud", "entity_alias": "champion", "autoscaling": {"latency_slo_ms": CANARY}}
            ]
        },
    },
    {
        "name": "x",
        "config": {
            "traffic_config": {"routes": [{"served_entity_name": CANARY, "traffic_percentage": 100}]},
            "served_entities": [{"entity_name": "fraud", "entity_alias": "champion"}],
        },
    },
    [CANARY],
    CANARY,
]


@pytest.mark.parametrize("body", HOSTILE_CREATE_BODIES, ids=[f"body{i}" for i in range(len(HOSTILE_CREATE_BODIES))])
def test_control_plane_errors_never_echo_the_payload(client, body):
    headers = {"Authorization": f"Bearer {ADMIN}"}
    reply = client.post("/api/2.0/serving-endpoints", json=body, headers=headers)
    assert 400 <= reply.status_code < 500, reply.text
    assert CANARY not in reply.text
    assert set(reply.json()) == {"error_code", "message"}
    raw = client.post(
        "/api/2.0/serving-endpoints",
        content=b'{"name": "' + CANARY.encode() + b'", ',
        headers={**headers, "content-type": "application/json"},
    )
    assert raw.status_code == 400 and CANARY not in raw.text


def test_unknown_keys_are_named_but_cut_short(client):
    """Messages name keys and positions (the convention of the whole API), never values; a key is cut to
    64 characters, so a payload hidden in a key cannot come back whole."""
    key = CANARY + "x" * 500
    reply = client.post(
        "/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={
            "name": "x",
            "config": {"served_entities": [{"entity_name": "fraud", "entity_alias": "champion", key: 1}]},
        },
    )
    assert reply.status_code == 400
    assert key not in reply.text and "x" * 100 not in reply.text


@pytest.mark.parametrize(
    "entity_name",
    [
        "/etc/passwd",
        "../fraud",
        "file:///tmp/model",
        "s3://bucket/model",
        "models:/fraud/1",
        "runs:/abc/model",
        "http://127.0.0.1:1/m",
        "fraud/1",
        "C:\\models\\fraud",
        "fraud@champion",
        "~root",
        ".",
        "fraud..x",
        "",
    ],
)
def test_a_served_entity_can_only_name_a_registry_model(client, entity_name):
    reply = client.post(
        "/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"name": "x", "config": {"served_entities": [{"entity_name": entity_name, "entity_version": "1"}]}},
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error_code"] == "INVALID_PARAMETER_VALUE"


def test_a_registry_name_that_the_registry_does_not_hold_is_refused(client):
    """The one value a message may name: a validated identifier (letters, digits, '_', '-', '.')."""
    reply = client.post(
        "/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {ADMIN}"},
        json={"name": "x", "config": {"served_entities": [{"entity_name": "not_registered", "entity_version": "1"}]}},
    )
    assert reply.status_code == 400 and "not_registered" in reply.json()["message"]


def test_bodies_over_the_size_limit_get_413_on_both_planes(client):
    headers = {"Authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    big = b'{"inputs": [' + b"1," * 40_000 + b"1]}"  # 80 kB, over the 64 kB limit
    assert client.post("/serving-endpoints/ep/invocations", content=big, headers=headers).status_code == 413
    assert client.post("/api/2.0/serving-endpoints", content=big, headers=headers).status_code == 413

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(40):
            yield b" " * 2048  # no content-length: counted as it arrives

    assert client.post("/serving-endpoints/ep/invocations", content=chunks(), headers=headers).status_code == 413
    assert client.post("/api/2.0/serving-endpoints", content=chunks(), headers=headers).status_code == 413
    small = client.post("/serving-endpoints/ep/invocations", content=b'{"inputs": [[1]]}', headers=headers)
    assert small.status_code == 200


def test_a_rate_limited_token_gets_429_with_retry_after_and_others_are_untouched(client):
    limited = {"Authorization": f"Bearer {LIMITED}", "content-type": "application/json"}
    codes = [
        client.post("/serving-endpoints/ep/invocations", content=b'{"inputs": [[1]]}', headers=limited)
        for _ in range(6)
    ]
    assert [r.status_code for r in codes[:3]] == [200, 200, 200]  # the burst
    refused = [r for r in codes if r.status_code == 429]
    assert len(refused) >= 2
    for reply in refused:
        assert reply.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED"
        assert int(reply.headers["retry-after"]) >= 1
        assert LIMITED not in reply.text
    # the control plane draws on the same bucket
    assert client.get("/api/2.0/serving-endpoints/ep", headers=limited).status_code == 429
    # another token, and the admin, are not limited by it
    scoped = {"Authorization": f"Bearer {SCOPED}", "content-type": "application/json"}
    admin = {"Authorization": f"Bearer {ADMIN}", "content-type": "application/json"}
    assert all(
        client.post("/serving-endpoints/ep/invocations", content=b'{"inputs": [[1]]}', headers=h).status_code == 200
        for h in (scoped, admin)
        for _ in range(5)
    )


def test_the_public_view_serves_the_data_plane_and_probes_only(app):
    public = app.public()
    with TestClient(public, raise_server_exceptions=False) as c:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for method, path, _ in every_route(app):
            reply = _call(c, method, path, admin)
            if path in PUBLIC_PATHS:
                assert reply.status_code in (200, 404) and reply.status_code == (200 if path == "/healthz" else 404)
            elif path.endswith("/invocations"):
                assert reply.status_code == 200, reply.text
            else:
                assert reply.status_code == 404, (method, path, reply.status_code)
                assert "admin API" in reply.json()["message"]
        app.state.manager.live.clear()


@pytest.mark.parametrize(
    "entry, named",
    [
        ({"requests_per_second": 0}, "requests_per_second"),
        ({"requests_per_second": "10"}, "requests_per_second"),
        ({"requests_per_second": 5, "burst": 0.5}, "burst"),
        ({"requests_per_second": 5, "per_minute": 3}, "per_minute"),
        ("fast", "rate_limit"),
    ],
)
def test_a_bad_rate_limit_in_the_tokens_file_is_refused_naming_the_field(tmp_path, entry, named):
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"tokens": [{"name": "a", "token": SCOPED, "endpoints": ["ep"], "rate_limit": entry}]}))
    with pytest.raises(ValueError, match=named) as caught:
        Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN, "TOLLFREE_TOKENS_FILE": str(path)})
    assert SCOPED not in str(caught.value)


V2_ROUTES = [
    ("GET", "/v2/health/live"),
    ("GET", "/v2/health/ready"),
    ("GET", "/v2"),
    ("GET", "/v2/models/ep"),
    ("GET", "/v2/models/ep/versions/1"),
    ("GET", "/v2/models/ep/ready"),
    ("POST", "/v2/models/ep/infer"),
    ("POST", "/v2/models/ep/versions/1/infer"),
]


def test_the_open_inference_protocols_routes_need_a_token_a_right_and_keep_the_rate_limit(client):
    for method, path in V2_ROUTES:
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789abcdef"}):
            reply = _call(client, method, path, headers)
            assert reply.status_code == 401 and set(reply.json()) == {"error"}, (method, path, reply.text)
        other = path.replace("/models/ep", "/models/other")
        if other != path:
            reply = _call(client, method, other, {"Authorization": f"Bearer {SCOPED}"})
            assert reply.status_code == 403, (method, other, reply.text)
    limited = {"Authorization": f"Bearer {LIMITED}"}
    codes = [client.get("/v2/health/live", headers=limited).status_code for _ in range(6)]
    assert codes[:3] == [200, 200, 200] and 429 in codes[3:]  # the burst, then the token's limit
    assert LIMITED not in client.get("/v2/models/ep", headers=limited).text


def test_the_open_inference_protocol_names_a_wrong_route_method_or_binary_header(client):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert client.get("/v2/repository/index", headers=admin).status_code == 404
    assert client.get("/v2/models/ep/infer", headers=admin).status_code == 405
    assert client.post("/v2/health/live", headers=admin).status_code == 405
    assert client.post("/v2/health/live").status_code == 401  # a stranger is not told which methods exist
    reply = client.post(
        "/v2/models/ep/infer", content=b"{}", headers={**admin, "Inference-Header-Content-Length": "many"}
    )
    assert reply.status_code == 400 and "Inference-Header-Content-Length".lower() in reply.json()["error"].lower()
