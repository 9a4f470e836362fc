"""The gateway's edge routes (``serving.edge.api``) on a fleet in SQLite: who may call what, and bad input answered
with a 4xx naming the field, never a 5xx and never the value (bodies fuzzed with hypothesis). The registry is a
stand-in here (the end-to-end test uses the real one): it knows one version with a bundle."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from serving.edge.api import EdgeApi
from serving.edge.bundle_files import NoBundle
from serving.edge.fleet import Fleet
from serving.endpoints.store import EndpointStore
from serving.inference_log import InferenceLogWriter, read_inference_log
from serving.protocol.errors import permission_denied, unauthenticated

ADMIN = {"Authorization": "Bearer admin-token-0123456789"}
_DEVICE_TOKENS: dict[int, dict[str, str]] = {}  # the fuzzed test's device, by client


class Registry:
    """Version 3 of model m has a bundle; nothing else does."""

    def __init__(self, folder: Path) -> None:
        self.file = folder / "m-3.tar"
        self.file.write_bytes(b"bundle bytes")

    def check(self, model: str, version: str) -> str:
        if (model, version) != ("m", "3"):
            raise NoBundle(f"{model} v{version} has no edge bundle")
        return "digest"

    def path(self, model: str, version: str) -> Path:
        self.check(model, version)
        return self.file


def _admin(header: str | None) -> None:
    if header is None:
        raise unauthenticated("invalid access token")
    if header != ADMIN["Authorization"]:
        raise permission_denied("this operation requires an admin token")


@pytest.fixture
def api(tmp_path: Path):
    store = EndpointStore(tmp_path / "state.db")
    log = InferenceLogWriter(tmp_path / "log", flush_interval_s=0.05)
    edge = EdgeApi(Fleet(store.database), Registry(tmp_path), log, _admin, lambda m, v, a: str(v or "3"))  # type: ignore[arg-type]
    with TestClient(edge) as client:
        yield client, tmp_path
    log.close()
    store.close()


def _register(client: TestClient, device: str = "d0", group: str = "g") -> dict[str, str]:
    made = client.post("/api/2.0/edge/devices", json={"device": device, "group": group}, headers=ADMIN)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['token']}"}


def test_operators_need_the_admin_token_and_devices_their_own(api: Any) -> None:
    client, _ = api
    assert client.get("/api/2.0/edge/devices").status_code == 401
    assert client.get("/api/2.0/edge/devices", headers={"Authorization": "Bearer nope"}).status_code == 403
    mine = _register(client, "d0")
    _register(client, "d1")
    assert client.get("/api/2.0/edge/devices/d0/desired", headers=mine).json() == {"model": None, "version": None}
    assert client.get("/api/2.0/edge/devices/d1/desired", headers=mine).status_code == 401  # another device's
    assert client.get("/api/2.0/edge/devices/d0/desired", headers=ADMIN).status_code == 401  # these act as the device
    assert client.post("/api/2.0/edge/rollouts", json={}, headers=mine).status_code == 403
    assert client.post("/api/2.0/edge/devices", json={"device": "d0", "group": "g"}, headers=ADMIN).status_code == 409

    started = client.post(
        "/api/2.0/edge/rollouts", json={"group": "g", "model": "m", "version": "3", "stages": [1.0]}, headers=ADMIN
    )
    assert started.status_code == 201 and started.json()["state"] == "running"
    desired = client.get("/api/2.0/edge/devices/d0/desired", headers=mine).json()
    assert desired["version"] == "3" and client.get(desired["bundle"], headers=mine).content == b"bundle bytes"
    assert client.get("/api/2.0/edge/devices/d0/bundles/m/2", headers=mine).status_code == 403  # not its rollout's
    refused = client.post("/api/2.0/edge/rollouts", json={"group": "g", "model": "m", "version": "2"}, headers=ADMIN)
    assert refused.status_code == 400 and "has no edge bundle" in refused.json()["message"]


def test_telemetry_lands_in_the_inference_log_once_with_the_device_and_group(api: Any) -> None:
    client, folder = api
    mine = _register(client, "d0", "shops")
    records = [
        {"seq": i, "timestamp": 1_700_000_000 + i, "model": "m", "version": "3", "inputs": {"a": [1.0]},
         "outputs": [[0.4, 0.6]], "latency_ms": 1.0, "status": 200}
        for i in (1, 2, 3)
    ]  # fmt: skip
    url = "/api/2.0/edge/devices/d0/telemetry"
    assert client.post(url, json={"stream": 5, "records": records}, headers=mine).json() == {"taken": 3, "skipped": 0}
    assert client.post(url, json={"stream": 5, "records": records[1:]}, headers=mine).json()["skipped"] == 2
    deadline = time.monotonic() + 10
    while len(log := read_inference_log(folder / "log", endpoint="edge:shops")) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(log) == 3 and set(log["device"]) == {"d0"} and set(log["served_entity"]) == {"m"}
    assert json.loads(log["inputs"][0]) == {"dataframe_split": {"columns": ["a"], "data": [[1.0]]}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    route=st.sampled_from(["/devices", "/rollouts", "/devices/d0/status", "/devices/d0/telemetry"]),
    body=st.one_of(
        st.binary(max_size=40),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
            max_leaves=12,
        ).map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {}, optional={k: st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=3)
                          for k in ("device", "group", "model", "version", "stages", "abort", "stream", "records")}
        ).map(lambda v: json.dumps(v).encode()),
    ),
)  # fmt: skip
def test_a_malformed_body_is_a_4xx_on_every_route(api: Any, route: str, body: bytes) -> None:
    client, _ = api
    headers = ADMIN
    if route.startswith("/devices/"):
        if id(client) not in _DEVICE_TOKENS:  # one fixture for all examples: the device is registered once
            _DEVICE_TOKENS[id(client)] = _register(client)
        headers = _DEVICE_TOKENS[id(client)]
    answer = client.post(f"/api/2.0/edge{route}", content=body, headers=headers)
    assert answer.status_code < 500, (route, body, answer.text)
    if answer.status_code >= 400:
        assert set(answer.json()) == {"error_code", "message"}
