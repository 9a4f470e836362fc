"""Monitoring for a model tollfree never trained, on endpoints of their own, beside the demo's ``fraud``.

- ``byo``: a scikit-learn model logged with ``mlflow.sklearn.log_model`` (no training dataset, no training
  frame). The scheduled drift flow (every endpoint) compares its traffic with its first served window: no
  drift on clean traffic; after three columns are shifted 3x, exactly those columns (and the prediction)
  are named. ``fraud`` is checked in the same runs.
- ``byo-gone``: its model is deleted from the registry; its check fails, the others still report.
- ``byo-split``: a split set by hand with the Databricks SDK (champion 80 % / a challenger that sleeps
  20 %) is adopted and rolled back by the canary flow; no client request fails.
"""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import mlflow
import numpy as np
import pandas as pd
import pytest
from databricks.sdk import WorkspaceClient
from databricks.sdk.service.serving import EndpointCoreConfigInput, Route, ServedEntityInput, TrafficConfig
from mlflow import MlflowClient
from mlflow.models import infer_signature
from sklearn.linear_model import LogisticRegression

from flows.canary import canary
from flows.skew import skew_all
from serving.endpoints.monitoring_results import load_latest
from serving.gateway.process import wait_endpoint_ready
from serving.registry import versions
from tests.gateways import LiveGateway
from tests.models import SleepyModel

pytestmark = pytest.mark.slow

MODEL, GONE = "byo", "byo_gone"
COLUMNS = ["a", "b", "c", "d", "e"]
SHIFTED = ["a", "b", "c"]
ROWS = 5  # rows per request
MONITORING = {"reference": {"first_requests": 60}, "min_rows": 150}


def frame(n: int, seed: int, shift: float = 1.0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = pd.DataFrame(rng.normal(5.0, 1.0, size=(n, len(COLUMNS))), columns=COLUMNS)
    data[SHIFTED] = data[SHIFTED] * shift
    return data


def experiment(world) -> str:  # type: ignore[no-untyped-def]
    """The user's own experiment, its artifacts in the session's state folder (never ./mlruns)."""
    return versions.ensure_experiment(MlflowClient(world.settings.tracking_uri), "byo", world.settings.artifacts_dir)


def log_own_model(world, name: str) -> str:  # type: ignore[no-untyped-def]
    """A model of the user's own: sklearn, a signature, no dataset and no training frame on its run."""
    x = frame(400, 0)
    y = (x["a"] + x["d"] > 10).astype(int)
    model = LogisticRegression().fit(x, y)
    with mlflow.start_run(experiment_id=experiment(world)):
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            signature=infer_signature(x, model.predict(x)),
            registered_model_name=name,
            pip_requirements=["scikit-learn"],  # given: inferring them loads the model in a process
        )
    return str(info.registered_model_version)


@pytest.fixture(scope="module")
def own(world, gateway: LiveGateway) -> dict[str, str]:
    """``byo`` v1 on the endpoint ``byo`` (monitoring: a 60-request first window) and ``byo_gone`` v1 on
    ``byo-gone``."""
    logged_versions = {"byo": log_own_model(world, MODEL), "gone": log_own_model(world, GONE)}
    with gateway.client(gateway.admin) as api:
        for endpoint, model in (("byo", MODEL), ("byo-gone", GONE)):
            created = api.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": endpoint,
                    "config": {
                        "served_entities": [{"entity_name": model, "entity_version": "1"}],
                        "monitoring": MONITORING,
                    },
                },
            )
            assert created.status_code == 200, created.text
    for endpoint in ("byo", "byo-gone"):
        wait_endpoint_ready(gateway.url, gateway.admin, endpoint)
    yield logged_versions
    with gateway.client(gateway.admin) as api:
        for endpoint in ("byo", "byo-gone"):
            api.delete(f"/api/2.0/serving-endpoints/{endpoint}")


def send(gateway: LiveGateway, endpoint: str, requests: int, seed: int, shift: float = 1.0) -> list[str]:
    data = frame(requests * ROWS, seed, shift)
    ids = []
    with gateway.client(gateway.admin) as client:
        for i in range(requests):
            rows = data.iloc[i * ROWS : (i + 1) * ROWS]
            reply = client.post(
                f"/serving-endpoints/{endpoint}/invocations",
                json={"dataframe_split": {"columns": COLUMNS, "data": rows.to_numpy().tolist()}},
            )
            assert reply.status_code == 200, reply.text
            ids.append(reply.headers["x-request-id"])
    return ids


def logged(world, endpoint: str, ids: list[str], timeout_s: float = 30.0) -> None:
    from serving.inference_log import read_inference_log

    deadline = time.monotonic() + timeout_s
    while set(ids) - set(read_inference_log(world.settings.inference_log_dir, endpoint=endpoint)["request_id"]):
        assert time.monotonic() < deadline, "requests not in the inference log"
        time.sleep(0.3)


def test_drift_of_a_model_never_trained_here_names_the_shifted_columns_and_a_failing_endpoint_stops_no_other(
    world, gateway, own
):
    # the first served window (60 requests), then clean traffic; byo-gone gets traffic of its own
    logged(world, "byo", send(gateway, "byo", 60, seed=1) + send(gateway, "byo", 40, seed=2))
    logged(world, "byo-gone", send(gateway, "byo-gone", 40, seed=3))
    clean = skew_all(fail_on_finding=False)
    assert {"byo", "fraud"} <= set(clean)  # every endpoint, the demo's among them
    byo = clean["byo"]["versions"][f"{MODEL}/1"]
    assert byo["reference"].startswith("first served window: 60 requests"), byo
    assert byo["compared_rows"] == 40 * ROWS and byo["drifted"] == [], byo
    assert clean["byo"]["verdict"] == "clean"

    # three columns shifted 3x; and byo_gone's model deleted from the registry
    logged(world, "byo", send(gateway, "byo", 120, seed=4, shift=3.0))
    MlflowClient(world.settings.tracking_uri).delete_registered_model(GONE)
    state = skew_all(return_state=True)
    assert state.is_failed()
    with pytest.raises(RuntimeError) as failed:
        state.result()
    message = str(failed.value)
    assert "byo-gone: failed" in message and f"drift {MODEL}/1:a" in message, message
    # recorded for the gateway: its console flags the endpoint and its metrics feed the TollfreeDriftFound alert
    recorded = load_latest(world.home, "byo")
    assert recorded is not None and recorded["verdict"] == "findings", recorded
    assert recorded["versions"][f"{MODEL}/1"]["drifted"], recorded
    with gateway.client(gateway.admin) as api:
        exported = re.search(r'^tollfree_drift_findings\{endpoint="byo"\} (\S+)$', api.get("/metrics").text, re.M)
    assert exported is not None and float(exported.group(1)) == len(recorded["findings"]) > 0
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    def latest(key: str):  # type: ignore[no-untyped-def]
        with get_client(sync_client=True) as client:
            found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        return max(found, key=lambda a: a.created)

    table, every = latest("skew-drift-byo"), latest("skew-drift-all")
    rows = {r["version"]: r for r in json.loads(table.data)}
    drifted = set(rows[f"{MODEL}/1"]["drifted"].split(", "))
    assert set(SHIFTED) <= drifted and not drifted & {"d", "e"}, drifted
    outcomes = {r["endpoint"]: r["outcome"] for r in json.loads(every.data)}
    assert outcomes["byo-gone"] == "failed" and outcomes["byo"] == outcomes["fraud"] == "completed", outcomes


def test_a_split_set_by_hand_with_the_sdk_is_adopted_and_a_slow_challenger_rolled_back(world, gateway, own):
    client = MlflowClient(world.settings.tracking_uri)
    inner = f"models:/{MODEL}/1"
    sample = frame(5, 9)
    with mlflow.start_run(experiment_id=experiment(world)):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=SleepyModel(0.05),
            artifacts={"inner": inner},
            signature=infer_signature(sample, mlflow.pyfunc.load_model(inner).predict(sample)),
            pip_requirements=["mlflow", "scikit-learn"],
            registered_model_name=MODEL,
        )
    slow = str(info.registered_model_version)
    client.set_registered_model_alias(MODEL, "champion", "1")
    client.set_registered_model_alias(MODEL, "challenger", slow)
    w = WorkspaceClient(host=gateway.url, token=gateway.admin)
    blue = ServedEntityInput(
        name="blue", entity_name=MODEL, entity_version="1", workload_size="Small", scale_to_zero_enabled=False
    )
    w.serving_endpoints.create_and_wait(
        name="byo-split", config=EndpointCoreConfigInput(name="byo-split", served_entities=[blue])
    )
    green = ServedEntityInput(
        name="green", entity_name=MODEL, entity_version=slow, workload_size="Small", scale_to_zero_enabled=False
    )
    w.serving_endpoints.update_config_and_wait(
        "byo-split",
        served_entities=[blue, green],
        traffic_config=TrafficConfig(
            routes=[
                Route(served_model_name="blue", traffic_percentage=80),
                Route(served_model_name="green", traffic_percentage=20),
            ]
        ),
    )
    statuses: list[int] = []
    stop = threading.Event()

    def traffic() -> None:
        body = {"dataframe_split": {"columns": COLUMNS, "data": frame(1, 11).to_numpy().tolist()}}
        with gateway.client(gateway.admin) as http:
            while not stop.is_set():
                try:
                    statuses.append(http.post("/serving-endpoints/byo-split/invocations", json=body).status_code)
                except httpx.TransportError:
                    statuses.append(-1)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        thresholds = {"min_requests": 30, "min_error_requests": 20, "min_labelled": 20, "bootstrap": 300}
        first = canary(endpoint="byo-split", thresholds=thresholds, min_dwell_s=0, drain_s=0, gateway_url=gateway.url)
        assert first["action"] == "adopted" and first["traffic"] == 20, first
        outcomes = []
        deadline = time.monotonic() + 180
        while not outcomes or outcomes[-1]["action"] == "hold":
            assert time.monotonic() < deadline, [(o["action"], o["reason"]) for o in outcomes[-3:]]
            time.sleep(1.0)
            outcomes.append(
                canary(
                    endpoint="byo-split",
                    thresholds=thresholds,
                    min_dwell_s=0,
                    drain_s=0,
                    gateway_url=gateway.url,
                    max_warn_hold_s=600,
                )
            )
    finally:
        stop.set()
        sender.join(30)
    final = outcomes[-1]
    assert final["action"] == "rollback" and "p99_latency" in final["reason"], final
    routes = w.serving_endpoints.get("byo-split").config.traffic_config.routes
    assert {r.served_model_name: r.traffic_percentage for r in routes} == {"blue": 100, "green": 0}
    aliases = versions.aliases(client, MODEL)
    assert aliases.get("champion") == "1" and "challenger" not in aliases
    assert statuses and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    w.serving_endpoints.delete("byo-split")
