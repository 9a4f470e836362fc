"""What a client gets when the model itself goes wrong, through a real gateway and a real replica: an
exception inside the model is a 500 (not a 400) naming the request id and logged with it; a model that does
not answer within the gateway's request timeout (``TOLLFREE_REQUEST_TIMEOUT_S``) is a 504; the replica serves
again once the hung call ends; the inference log holds each of them with its status. While a predict hangs,
whether it came on the frame socket (through the gateway) or over HTTP, the replica's ``/health/live`` answers at
once: its probes never wait on a predict.

The same gateway, started with ``--port 0``, is the one the flows and the MLflow plugin find through the record it
keeps in its state folder, with only ``TOLLFREE_HOME`` set; once it has stopped, its record is gone and a failed call
names ``TOLLFREE_GATEWAY_URL``. (tests/unit/test_discovery.py holds the resolver's rules.)"""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import httpx
import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import infer_signature

from flows.gateway_api import GatewayApi, GatewayError
from serving.discovery import read_records, resolve_gateway
from serving.gateway.process import GatewayProcess, environ_with, wait_endpoint_ready
from serving.inference_log import read_inference_log
from serving.mlflow_plugin import TollfreeDeploymentClient
from tests.gateways import command_words, replicas_of, start_on_any_port
from tests.models import TrapModel
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

ENDPOINT = "traps"
TIMEOUT_S = 3.0
HANG_S = 6.0
T = TypeVar("T")
REPLICA_TOKEN = "traps-replica-" + secrets.token_hex(8)


@pytest.fixture(scope="module")
def live(world, tmp_path_factory) -> Iterator[tuple[GatewayProcess, str, Path]]:
    client = MlflowClient(world.settings.tracking_uri)
    experiment = client.get_run(client.get_model_version_by_alias(MODEL_NAME, "champion").run_id).info.experiment_id
    frame = pd.DataFrame({"x": [1.0]})
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=TrapModel(HANG_S),
            pip_requirements=["mlflow"],
            signature=infer_signature(frame, [2.0]),
            registered_model_name="traps",
        )
    home = tmp_path_factory.mktemp("traps-home")
    env = environ_with(
        {
            "TOLLFREE_REQUEST_TIMEOUT_S": str(TIMEOUT_S),
            "TOLLFREE_HOME": str(home),
            "TOLLFREE_WARM_POOL": "0",
            "TOLLFREE_REPLICA_TOKEN": REPLICA_TOKEN,
        }
    )
    env.pop("TOLLFREE_GATEWAY_URL", None)
    process = start_on_any_port(env, home / "gateway.log")
    token = env["TOLLFREE_TOKEN"]
    try:
        with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as api:
            created = api.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": ENDPOINT,
                    "config": {
                        "served_entities": [
                            {
                                "entity_name": "traps",
                                "entity_version": str(info.registered_model_version),
                                "max_concurrency": 4,
                            }
                        ]
                    },
                },
            )
            assert created.status_code == 200, created.text
        wait_endpoint_ready(process.url, token, ENDPOINT)
        yield process, token, home
    finally:
        process.stop()


def _invoke(url: str, token: str, x: float) -> tuple[httpx.Response, str, float]:
    request_id = "trap-" + secrets.token_hex(6)
    started = time.monotonic()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        reply = client.post(
            f"/serving-endpoints/{ENDPOINT}/invocations",
            json={"dataframe_split": {"columns": ["x"], "data": [[x]]}},
            headers={"x-request-id": request_id},
        )
    return reply, request_id, time.monotonic() - started


def test_the_flows_and_the_plugin_find_the_gateway_on_another_port_by_its_record(live, monkeypatch):
    process, token, home = live
    flows_env = {"TOLLFREE_HOME": str(home), "TOLLFREE_TOKEN": token}  # no TOLLFREE_GATEWAY_URL
    assert int(process.url.rsplit(":", 1)[1]) not in (0, 8080)
    api = GatewayApi.from_environ(flows_env)
    try:
        assert (api.url, api.address.source) == (process.url, "record")
        assert api.names() == [ENDPOINT]  # the control plane answered, with the admin token
    finally:
        api.close()
    monkeypatch.delenv("TOLLFREE_GATEWAY_URL", raising=False)
    monkeypatch.setenv("TOLLFREE_HOME", str(home))
    assert [d["name"] for d in TollfreeDeploymentClient("tollfree").list_deployments()] == [ENDPOINT]


def _served_again(url: str, token: str, within_s: float) -> httpx.Response:
    """The first answer 200 to a call the replica can serve; meanwhile the hung call holds it (a 504 each)."""
    deadline = time.monotonic() + within_s
    while True:
        reply, _, _ = _invoke(url, token, 3.0)
        if reply.status_code == 200 or time.monotonic() > deadline:
            assert reply.status_code == 200, f"no answer 200 within {within_s:.0f}s of the hang: {reply.text}"
            return reply
        assert reply.status_code == 504, reply.text


def _replica_url(process: GatewayProcess) -> str:
    [replica] = replicas_of(process)
    words = command_words(replica)
    return f"http://127.0.0.1:{words[words.index('--port') + 1]}"


def _health_while(replica_url: str, call: Callable[[], T]) -> tuple[T, list[float]]:
    """``call``'s result, and the latencies (ms) of ``GET /health/live`` sent back to back while it ran."""
    latencies: list[float] = []
    with ThreadPoolExecutor(1) as pool, httpx.Client(base_url=replica_url, timeout=10) as probe:
        running = pool.submit(call)
        while not running.done():
            started = time.perf_counter()
            assert probe.get("/health/live").status_code == 200
            latencies.append((time.perf_counter() - started) * 1000)
            time.sleep(0.02)  # the probes' pace, not a wait for a condition
        return running.result(), latencies


def test_a_model_exception_is_a_500_with_the_request_id_logged_and_a_hang_a_504(live, record_property):
    process, token, home = live

    failed, failed_id, _ = _invoke(process.url, token, 7.0)
    assert failed.status_code == 500, failed.text
    body = failed.json()
    assert body["error_code"] == "INTERNAL_ERROR" and failed_id in body["message"]
    assert "SECRET-MODEL-DETAIL" not in failed.text and "Traceback" not in failed.text

    ok, _, _ = _invoke(process.url, token, 2.0)
    assert ok.status_code == 200 and ok.json() == {"predictions": [4.0]}

    # a predict that hangs, sent over HTTP to the replica itself: its probes answer all along
    replica = _replica_url(process)
    direct, over_http = _health_while(
        replica,
        lambda: httpx.post(
            f"{replica}/invocations",
            json={"dataframe_split": {"columns": ["x"], "data": [[13.0]]}},
            headers={"Authorization": f"Bearer {REPLICA_TOKEN}"},
            timeout=60,
        ),
    )
    assert direct.status_code == 200 and direct.json() == {"predictions": [26.0]}, direct.text

    # one through the gateway, which sends it on the frame socket: a 504 at the gateway's timeout, and meanwhile
    # the replica's probes answer as before
    (hung, hung_id, took), on_frames = _health_while(replica, lambda: _invoke(process.url, token, 13.0))
    assert hung.status_code == 504, hung.text
    assert hung.json()["error_code"] == "DEADLINE_EXCEEDED" and "SECRET" not in hung.text
    assert TIMEOUT_S - 0.5 <= took < TIMEOUT_S + 4.0, took
    for path, latencies in (("http", over_http), ("frames", on_frames)):
        figures = {"probes": len(latencies), "p50_ms": statistics.median(latencies), "max_ms": max(latencies)}
        record_property(f"health_during_predict_{path}", figures)
        print(f"/health/live while a {HANG_S:g} s predict runs ({path}):", figures)
        # the goal is 100 ms; a predict on the event loop would hold a probe for seconds
        assert len(latencies) >= 10 and max(latencies) < 1000, (path, figures)

    # the replica predicts one call at a time: once the hung one ends, it serves again
    after = _served_again(process.url, token, within_s=HANG_S + TIMEOUT_S + 10.0)
    assert after.json() == {"predictions": [6.0]}

    process.stop()  # graceful: replicas stopped, logs and the inference log flushed
    logs = "\n".join(p.read_text(errors="replace") for p in home.rglob("*.log"))
    assert f"model failed on request {failed_id}" in logs  # the replica logged the failure with its request id
    logged = read_inference_log(home / "inference_log", endpoint=ENDPOINT).set_index("request_id")
    assert logged.loc[failed_id, "status_code"] == 500 and logged.loc[hung_id, "status_code"] == 504


def test_once_stopped_its_record_is_gone_and_a_failed_call_names_the_variable(live):
    process, token, home = live
    process.stop()  # graceful (when the test before has not stopped it already)
    assert read_records(home / "gateways") == []  # removed on the clean shutdown
    flows_env = {"TOLLFREE_HOME": str(home), "TOLLFREE_TOKEN": token}
    gone = resolve_gateway(flows_env, default=process.url)  # its port as the default: surely refused now
    assert gone.source == "default"
    with pytest.raises(GatewayError) as failed:
        GatewayApi(gone.url, token, address=gone).names()
    assert "TOLLFREE_GATEWAY_URL" in str(failed.value) and process.url in str(failed.value)
    assert str(home / "gateways") in str(failed.value)
