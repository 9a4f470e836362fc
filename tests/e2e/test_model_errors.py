"""What a client gets when the model itself goes wrong, through a real gateway and a real replica: an
exception inside the model is a 500 (not a 400) naming the request id and logged with it; a model that does
not answer within the gateway's request timeout (``TOLLFREE_REQUEST_TIMEOUT_S``) is a 504; the replica serves
again once the hung call ends; the inference log holds each of them with its status."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import infer_signature

from serving.gateway.process import GatewayProcess, environ_with, start_gateway, wait_endpoint_ready
from serving.inference_log import read_inference_log
from tests.models import TrapModel
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

ENDPOINT = "traps"
TIMEOUT_S = 3.0
HANG_S = 8.0


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
        {"TOLLFREE_REQUEST_TIMEOUT_S": str(TIMEOUT_S), "TOLLFREE_HOME": str(home), "TOLLFREE_WARM_POOL": "0"}
    )
    process = start_gateway(env, home / "gateway.log")
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


def test_a_model_exception_is_a_500_with_the_request_id_logged_and_a_hang_a_504(live):
    process, token, home = live

    failed, failed_id, _ = _invoke(process.url, token, 7.0)
    assert failed.status_code == 500, failed.text
    body = failed.json()
    assert body["error_code"] == "INTERNAL_ERROR" and failed_id in body["message"]
    assert "SECRET-MODEL-DETAIL" not in failed.text and "Traceback" not in failed.text

    ok, _, _ = _invoke(process.url, token, 2.0)
    assert ok.status_code == 200 and ok.json() == {"predictions": [4.0]}

    hung, hung_id, took = _invoke(process.url, token, 13.0)
    assert hung.status_code == 504, hung.text
    assert hung.json()["error_code"] == "DEADLINE_EXCEEDED" and "SECRET" not in hung.text
    assert TIMEOUT_S - 0.5 <= took < TIMEOUT_S + 4.0, took

    time.sleep(HANG_S - took + 1.0)  # the replica predicts one call at a time: once the hung one ends, it serves again
    after, _, _ = _invoke(process.url, token, 3.0)
    assert after.status_code == 200 and after.json() == {"predictions": [6.0]}

    process.stop()  # graceful: replicas stopped, logs and the inference log flushed
    logs = "\n".join(p.read_text(errors="replace") for p in home.rglob("*.log"))
    assert f"model failed on request {failed_id}" in logs  # the replica logged the failure with its request id
    logged = read_inference_log(home / "inference_log", endpoint=ENDPOINT).set_index("request_id")
    assert logged.loc[failed_id, "status_code"] == 500 and logged.loc[hung_id, "status_code"] == 504
