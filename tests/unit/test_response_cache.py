from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from serving.endpoints.spec import EndpointCoreConfig
from serving.gateway.auth import Tokens
from serving.protocol.wire import WireAnswer, WireReply, WireRequest
from serving.traffic.response_cache import ResponseCache
from tests.fakes import FakeReplica, in_process_gateway

TOKEN = "unit-test-admin-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_and_the_least_recently_used_goes_first():
    clock = Clock()
    cache = ResponseCache(max_entries=2, ttl_s=10, clock=clock)
    cache.put(("a",), 1)
    cache.put(("b",), 2)
    assert cache.get(("a",)) == 1  # a is now the most recently used
    cache.put(("c",), 3)
    assert cache.get(("b",)) is None and cache.get(("a",)) == 1 and cache.get(("c",)) == 3
    clock.now = 10.0
    assert cache.get(("a",)) is None and len(cache) == 1
    assert (cache.hits, cache.misses) == (3, 2)
    with pytest.raises(ValueError):
        ResponseCache(max_entries=0, ttl_s=1)


def test_the_cache_config_is_checked():
    config = EndpointCoreConfig.model_validate(
        {"served_entities": [], "response_cache": {"enabled": True, "ttl_seconds": 5}}
    )
    assert config.response_cache.max_entries == 10_000
    with pytest.raises(ValidationError, match=r"response_cache\.ttl_seconds"):
        EndpointCoreConfig.model_validate(
            {"served_entities": [], "response_cache": {"enabled": True, "ttl_seconds": 0}}
        )
    with pytest.raises(ValidationError, match=r"response_cache\.size"):
        EndpointCoreConfig.model_validate({"served_entities": [], "response_cache": {"size": 3}})


def _app(tmp_path, cache: ResponseCache | None, calls: list[bytes]):
    async def upstream(replica: FakeReplica, requests: list[WireRequest]) -> WireReply:
        answers = []
        for request in requests:
            calls.append(request.body)
            answers.append(WireAnswer(200, 1, json.dumps([len(calls)]).encode(), b'[{"f":1.0}]'))
        return WireReply(answers)

    return in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}), send=upstream, cache=cache)


def _post(client: TestClient, body: str) -> httpx.Response:
    return client.post(
        "/serving-endpoints/ep/invocations",
        content=body,
        headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
    )


def test_identical_payloads_are_answered_from_the_cache_only_when_enabled(tmp_path):
    calls: list[bytes] = []
    app = _app(tmp_path / "on", ResponseCache(100, 60), calls)
    with TestClient(app) as client:
        first = _post(client, json.dumps({"inputs": {"a": [1], "b": [2]}}))
        again = _post(client, '{"inputs": {"b": [2], "a": [1]}}')  # same payload, other key order and spacing
        other = _post(client, json.dumps({"inputs": {"a": [9], "b": [2]}}))
        metrics = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text
        app.state.manager.live.clear()
    assert len(calls) == 2
    assert first.json() == again.json() == {"predictions": [1]} and other.json() == {"predictions": [2]}
    assert [r.headers["x-tollfree-cache"] for r in (first, again, other)] == ["miss", "hit", "miss"]
    assert 'tollfree_cache_hits_total{endpoint="ep"} 1.0' in metrics

    calls_off: list[bytes] = []
    app_off = _app(tmp_path / "off", None, calls_off)
    with TestClient(app_off) as client:
        for _ in range(3):
            assert "x-tollfree-cache" not in _post(client, json.dumps({"inputs": {"a": [1]}})).headers
        app_off.state.manager.live.clear()
    assert len(calls_off) == 3
