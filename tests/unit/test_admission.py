"""The gateway's admission: a slot under the concurrency limit, a bounded queue, 429 + Retry-After past
it. The gateway runs in-process; its upstream is an httpx transport seam standing in for a replica
that takes 300 ms per request (the real-replica path is covered by the e2e tests)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.admission import Admission, AdmissionRefused
from serving.auth import TokenRegistry
from serving.endpoint_manager import EndpointManager, LiveEndpoint, ServedEntity
from serving.endpoint_store import EndpointStore
from serving.gateway import create_gateway_app
from serving.inference_log import InferenceLogWriter, read_inference_log

TOKEN = "unit-test-admin-token-0123456789"


@dataclass
class SlowReplica:
    url: str
    outstanding: int = 0
    pid: int = 0
    port: int = 0

    def alive(self) -> bool:
        return True


async def slow_upstream(request: httpx.Request) -> httpx.Response:
    await asyncio.sleep(0.3)
    return httpx.Response(200, json={"predictions": [0.5]})


def gateway(tmp_path, admission: Admission):
    manager = EndpointManager(EndpointStore(tmp_path / "endpoints.db"), lambda *a: "1", {}, tmp_path / "logs")
    entity = ServedEntity("m-1", "m", "1", replicas=[SlowReplica("http://replica")], max_concurrency=1, admission=admission)
    manager.live["ep"] = LiveEndpoint({"m-1": entity}, [("m-1", 100)])
    log = InferenceLogWriter(tmp_path / "log")
    app = create_gateway_app(manager, TokenRegistry.from_environ({"TOLLFREE_TOKEN": TOKEN}), log,
                             transport=httpx.MockTransport(slow_upstream))
    return app


def burst(client: TestClient, n: int) -> list[httpx.Response]:
    def one(_: int) -> httpx.Response:
        return client.post("/serving-endpoints/ep/invocations", content=json.dumps({"inputs": [[1]]}),
                           headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"})

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_excess_beyond_the_queue_gets_429_with_retry_after_and_the_rest_is_served(tmp_path):
    app = gateway(tmp_path, Admission(max_queue=2, max_wait_s=5))
    with TestClient(app) as client:
        started = time.monotonic()
        replies = burst(client, 5)
        elapsed = time.monotonic() - started
        app.state.manager.live.clear()  # no replica processes to stop at shutdown
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 200, 429, 429]
    refused = [r for r in replies if r.status_code == 429]
    assert all(r.headers["Retry-After"] == "1" and r.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED" for r in refused)
    assert all(r.headers["served-model-name"] == "m-1" for r in replies if r.status_code == 200)
    assert 0.85 < elapsed < 3.0  # three served one after another at 0.3 s each, behind a limit of one
    logged = read_inference_log(tmp_path / "log", endpoint="ep")
    assert sorted(logged["status_code"]) == codes  # rejected requests are logged too


def test_a_queued_request_that_waits_too_long_is_refused(tmp_path):
    app = gateway(tmp_path, Admission(max_queue=10, max_wait_s=0.1))
    with TestClient(app) as client:
        replies = burst(client, 3)
        app.state.manager.live.clear()
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 429, 429]
    assert any("within 0.1s" in r.json()["message"] for r in replies if r.status_code == 429)


def test_admission_hands_a_freed_slot_to_the_next_waiter():
    async def scenario() -> list[str]:
        replica = SlowReplica("r")
        admission = Admission(max_queue=5, max_wait_s=2)
        order: list[str] = []
        first = await admission.acquire(lambda: [replica], 1)

        async def waiter(tag: str) -> None:
            got = await admission.acquire(lambda: [replica], 1)
            order.append(tag)
            await asyncio.sleep(0.01)
            await admission.release(got)

        tasks = [asyncio.create_task(waiter(t)) for t in ("a", "b")]
        await asyncio.sleep(0.05)
        assert admission.waiting == 2 and replica.outstanding == 1
        await admission.release(first)
        await asyncio.gather(*tasks)
        assert replica.outstanding == 0
        return order

    assert asyncio.run(scenario()) == ["a", "b"]
    with pytest.raises(ValueError):
        Admission(max_queue=-1)
    with pytest.raises(AdmissionRefused):
        asyncio.run(Admission(max_queue=0).acquire(lambda: [SlowReplica("r", outstanding=1)], 1))
