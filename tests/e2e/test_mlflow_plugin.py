"""The MLflow deployments plugin (target ``tollfree``) against a live gateway: Python API and ``mlflow deployments``.

The tests run in file order on one deployment, ``plugin-ep``: create, read, predict, update, CLI, delete.
Two replica starts in all (create, then the update to a pinned version).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.deployments import PredictionsResponse, get_deploy_client
from mlflow.exceptions import MlflowException

from feature_repo import synthetic
from serving import mlflow_plugin
from serving.gateway.process import environ_with
from tests.gateways import LiveGateway
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

NAME = "plugin-ep"
MLFLOW_CLI = Path(sys.executable).parent / "mlflow"


@pytest.fixture(scope="module")
def live(gateway: LiveGateway) -> LiveGateway:
    """The session gateway."""
    return gateway


@pytest.fixture(scope="module")
def plugin_env(live: LiveGateway) -> dict[str, str]:
    return {"TOLLFREE_GATEWAY_URL": live.url, "TOLLFREE_TOKEN": live.admin}


@pytest.fixture(scope="module")
def client(plugin_env):
    with pytest.MonkeyPatch.context() as mp:
        for key, value in plugin_env.items():
            mp.setenv(key, value)
        client = get_deploy_client("tollfree")
        yield client
        client.delete_deployment(NAME)  # idempotent: leaves nothing behind if a test failed half-way


@pytest.fixture(scope="module")
def rows(world) -> pd.DataFrame:
    tx = synthetic.read_transactions(world.settings.data_dir)
    return tx.sample(6, random_state=17)[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)


def gateway_answer(live: LiveGateway, body: dict) -> list:
    """The gateway's own answer, over plain HTTP (not ``live.invoke``: its request ids belong to ``fraud``)."""
    with live.client(live.admin) as http:
        reply = http.post(f"/serving-endpoints/{NAME}/invocations", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()["predictions"]


def mlflow_cli(plugin_env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MLFLOW_CLI), "deployments", *args],
        env=environ_with(plugin_env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_create_ends_ready_and_is_listed(client, world):
    created = client.create_deployment(name=NAME, model_uri=f"models:/{MODEL_NAME}@champion")
    assert (created["name"], created["state"], created["config_update"]) == (NAME, "READY", "NOT_UPDATING")
    assert created["flavor"] == "python_function" and created["model_uri"] == f"models:/{MODEL_NAME}@champion"
    assert {"fraud", NAME} <= {d["name"] for d in client.list_deployments()}
    got = client.get_deployment(NAME)
    assert got["served_entities"][0]["version"] == str(world.trained["version"])
    assert got["invocations_url"].endswith(f"/serving-endpoints/{NAME}/invocations")


def test_predict_equals_the_gateways_own_answer(client, live, rows):
    expected = gateway_answer(live, {"dataframe_split": rows.to_dict(orient="split", index=False)})
    response = client.predict(NAME, rows)
    assert isinstance(response, PredictionsResponse)
    assert response["predictions"] == expected
    assert response.get_predictions(predictions_format="ndarray").shape == (len(rows), 2)
    as_records = client.predict(deployment_name=NAME, inputs={"dataframe_records": rows.to_dict(orient="records")})
    assert as_records["predictions"] == expected


def test_update_to_a_pinned_version_ends_ready(client, live, rows, world):
    before = gateway_answer(live, {"dataframe_split": rows.to_dict(orient="split", index=False)})
    version = str(world.trained["version"])
    updated = client.update_deployment(NAME, model_uri=f"models:/{MODEL_NAME}/{version}")
    assert (updated["state"], updated["config_update"]) == ("READY", "NOT_UPDATING")
    assert updated["model_uri"] == f"models:/{MODEL_NAME}/{version}"
    assert [e["name"] for e in updated["served_entities"]] == [f"{MODEL_NAME}-{version}"]
    assert client.predict(NAME, rows)["predictions"] == before  # the champion is that version
    tuned = client.update_deployment(NAME, config={"max_concurrency": "8"})  # config only: same model, no restart
    assert tuned["served_entities"][0]["max_concurrency"] == 8 and tuned["model_uri"] == updated["model_uri"]


def test_cli_lists_and_gets_the_deployment(plugin_env, live):
    listed = mlflow_cli(plugin_env, "list", "-t", "tollfree")
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert NAME in listed.stdout
    got = mlflow_cli(plugin_env, "get", "-t", f"tollfree:/{live.url}", "--name", NAME)
    assert got.returncode == 0, got.stderr[-2000:]
    assert f"name: {NAME}" in got.stdout and "state: READY" in got.stdout
    assert live.admin not in listed.stdout + listed.stderr + got.stdout + got.stderr


def test_delete_removes_the_deployment(client):
    client.delete_deployment(NAME)
    with pytest.raises(MlflowException, match="RESOURCE_DOES_NOT_EXIST") as missing:
        client.get_deployment(NAME)
    assert missing.value.get_http_status_code() == 404
    assert NAME not in {d["name"] for d in client.list_deployments()}
    client.delete_deployment(NAME)  # deleting again is not an error


def test_refusals_are_clear(client):
    with pytest.raises(MlflowException, match="registered models only") as run_uri:
        client.create_deployment(name="plugin-run", model_uri="runs:/0123456789abcdef/model")
    assert run_uri.value.error_code == "INVALID_PARAMETER_VALUE"
    with pytest.raises(MlflowException, match="'replica_count'"):
        client.create_deployment(
            name="plugin-bad", model_uri=f"models:/{MODEL_NAME}@champion", config={"replica_count": "2"}
        )
    with pytest.raises(MlflowException, match="max_replicas must be an integer"):
        client.create_deployment(name="plugin-bad", model_uri=f"models:/{MODEL_NAME}/1", config={"max_replicas": "two"})
    with pytest.raises(MlflowException, match="pin a version"):
        client.create_deployment(name="plugin-bad", model_uri=f"models:/{MODEL_NAME}/latest")
    with pytest.raises(MlflowException, match="python -m serving"):
        mlflow_plugin.run_local("x", f"models:/{MODEL_NAME}/1")
    names = {d["name"] for d in client.list_deployments()}
    assert not names & {"plugin-run", "plugin-bad"}


def test_bad_token_is_refused_without_echoing_it(live, monkeypatch):
    wrong = "wrong-token-" + secrets.token_hex(16)
    monkeypatch.setenv("TOLLFREE_GATEWAY_URL", live.url)
    monkeypatch.setenv("TOLLFREE_TOKEN", wrong)
    with pytest.raises(MlflowException) as denied:
        get_deploy_client("tollfree").list_deployments()
    assert denied.value.error_code == "UNAUTHENTICATED"
    assert wrong not in str(denied.value) and wrong not in denied.value.serialize_as_json()
    assert live.admin not in str(denied.value)
    monkeypatch.delenv("TOLLFREE_TOKEN")
    with pytest.raises(MlflowException, match="TOLLFREE_TOKEN is not set"):
        get_deploy_client("tollfree").get_deployment("fraud")
