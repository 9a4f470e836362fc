"""Two in-process gateways over one real PostgreSQL state store (fake replicas): conflicting config updates
sent through both at once get one winner and a 409 ``RESOURCE_CONFLICT``, never a mixed config; with the
database down, the data plane keeps answering from memory while the endpoints API gets 503 naming the store
(no password), and both recover when it returns."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from fastapi.testclient import TestClient

from serving.endpoints import spec, validation
from serving.endpoints.store import EndpointStore
from serving.gateway.auth import Tokens
from tests.fakes import in_process_gateway

TOKEN = "integration-test-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _stored_endpoint(store: EndpointStore) -> None:
    """Endpoint ``ep`` as the in-process gateway serves it (entity m-1 = model m, version 1), settled."""
    config = validation.normalize_config(
        spec.EndpointCoreConfig.model_validate(
            {"served_entities": [{"name": "m-1", "entity_name": "m", "entity_version": "1"}]}
        ),
        "ep",
    )
    config.served_entities[0].resolved_version = "1"
    store.create(
        spec.EndpointRecord(
            name="ep",
            id="id-ep",
            creator="test",
            created_ms=0,
            updated_ms=0,
            config=config,
            config_version=1,
            ready="READY",
            config_update="NOT_UPDATING",
            pending_config=None,
            ai_gateway=None,
            state_message=None,
        )
    )


def _settled(client: TestClient, deadline_s: float = 30.0) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        view = client.get("/api/2.0/serving-endpoints/ep", headers=AUTH).json()
        if view["state"]["config_update"] == "NOT_UPDATING" or time.monotonic() > deadline:
            return view
        time.sleep(0.05)


def test_conflicting_updates_through_two_gateways_get_one_winner_and_a_409(postgres, tmp_path):
    url = postgres.url(postgres.new_database())
    _stored_endpoint(EndpointStore(url))
    both_read = threading.Barrier(2, timeout=20)

    def resolve(model: str, version: str | None, alias: str | None) -> str:
        both_read.wait()  # each gateway has read the settled record before either writes
        return "1"

    tokens = Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN})
    apps = [in_process_gateway(tmp_path / name, tokens, resolve=resolve, store=EndpointStore(url)) for name in "ab"]
    with TestClient(apps[0]) as a, TestClient(apps[1]) as b:
        _settled(a), _settled(b)  # both restored the stored endpoint at start

        def update(job: tuple[TestClient, int]) -> tuple[int, dict]:
            client, limit = job
            body = {
                "served_entities": [
                    {"name": "m-1", "entity_name": "m", "entity_version": "1", "max_concurrency": limit}
                ]
            }
            reply = client.put("/api/2.0/serving-endpoints/ep/config", json=body, headers=AUTH)
            return reply.status_code, reply.json()

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(update, [(a, 3), (b, 5)]))
        view = _settled(a)
        for app in apps:
            app.state.manager.live.clear()  # fake replicas: nothing to stop
    codes = sorted(code for code, _ in results)
    assert codes == [200, 409], results
    loser = next(body for code, body in results if code == 409)
    assert loser["error_code"] == "RESOURCE_CONFLICT" and "changed concurrently" in loser["message"]
    winner = 3 if results[0][0] == 200 else 5
    assert view["config"]["served_entities"][0]["max_concurrency"] == winner
    assert view["state"]["config_update"] == "NOT_UPDATING" and view["config"]["config_version"] == 2


def test_with_the_database_down_the_data_plane_serves_and_the_api_says_503_then_recovers(postgres, tmp_path):
    url = postgres.url(postgres.new_database())
    _stored_endpoint(EndpointStore(url))
    app = in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}), store=EndpointStore(url))
    invoke = {"content": json.dumps({"inputs": [[1]]}), "headers": {**AUTH, "content-type": "application/json"}}
    with TestClient(app) as client:
        _settled(client)
        postgres.stop()
        try:
            served = [client.post("/serving-endpoints/ep/invocations", **invoke) for _ in range(20)]
            read = client.get("/api/2.0/serving-endpoints/ep", headers=AUTH)
            write = client.put(
                "/api/2.0/serving-endpoints/ep/config",
                headers=AUTH,
                json={"served_entities": [{"name": "m-1", "entity_name": "m", "entity_version": "1"}]},
            )
        finally:
            postgres.start()
        back = client.get("/api/2.0/serving-endpoints/ep", headers=AUTH)
        again = client.post("/serving-endpoints/ep/invocations", **invoke)
        app.state.manager.live.clear()
    assert [r.status_code for r in served] == [200] * 20
    for failed in (read, write):
        assert failed.status_code == 503 and failed.json()["error_code"] == "TEMPORARILY_UNAVAILABLE"
        assert "tollfree:***@127.0.0.1" in failed.json()["message"] and postgres.password not in failed.text
    assert back.status_code == 200 and back.json()["name"] == "ep"
    assert again.status_code == 200
