"""Config updates on a live gateway: a failed rollout ends UPDATE_FAILED and the old config keeps
serving every request meanwhile; a model-free change (traffic, cache) restarts no replica."""

from __future__ import annotations

import threading
import time

import httpx
import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import infer_signature

from feature_repo import synthetic
from tests.models import BrokenOnLoad
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

NAME = "rollout"


def _wait(client: httpx.Client, predicate, timeout_s: float = 180) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = client.get(f"/api/2.0/serving-endpoints/{NAME}").json()
        if predicate(view["state"]):
            return view
        time.sleep(0.3)
    raise TimeoutError(view["state"])


def test_a_failed_rollout_keeps_the_old_config_serving(world, gateway):
    client = MlflowClient(world.settings.tracking_uri)
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    with mlflow.start_run(experiment_id=client.get_run(champion.run_id).info.experiment_id):
        frame = pd.DataFrame({"x": [1.0]})
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=BrokenOnLoad(),
            pip_requirements=["mlflow"],
            signature=infer_signature(frame, [0.0]),
            registered_model_name="broken",
        )
    broken_version = str(info.registered_model_version)
    rows = synthetic.read_transactions(world.settings.data_dir).head(2)[["customer_id", "merchant_id", "amount"]]
    body = {"dataframe_records": rows.to_dict(orient="records")}

    with gateway.client(gateway.admin) as api:
        created = api.post(
            "/api/2.0/serving-endpoints",
            json={
                "name": NAME,
                "config": {
                    "served_entities": [
                        {"name": "stable", "entity_name": MODEL_NAME, "entity_version": champion.version}
                    ]
                },
            },
        )
        assert created.status_code == 200, created.text
        _wait(api, lambda s: s == {"ready": "READY", "config_update": "NOT_UPDATING"})

        statuses: list[int] = []
        stop = threading.Event()

        def traffic() -> None:
            with gateway.client(gateway.admin) as c:
                while not stop.is_set():
                    statuses.append(c.post(f"/serving-endpoints/{NAME}/invocations", json=body).status_code)

        worker = threading.Thread(target=traffic)
        worker.start()
        try:
            update = api.put(
                f"/api/2.0/serving-endpoints/{NAME}/config",
                json={
                    "served_entities": [
                        {"name": "stable", "entity_name": MODEL_NAME, "entity_version": champion.version},
                        {"name": "bad", "entity_name": "broken", "entity_version": broken_version},
                    ],
                    "traffic_config": {
                        "routes": [
                            {"served_model_name": "stable", "traffic_percentage": 50},
                            {"served_model_name": "bad", "traffic_percentage": 50},
                        ]
                    },
                },
            )
            assert update.status_code == 200 and update.json()["state"]["config_update"] == "IN_PROGRESS"
            assert "pending_config" in update.json()
            failed = _wait(api, lambda s: s["config_update"] == "UPDATE_FAILED")
        finally:
            stop.set()
            worker.join()
        assert failed["state"]["ready"] == "READY"
        assert [e["name"] for e in failed["config"]["served_entities"]] == ["stable"]
        assert "state_message" in failed
        assert statuses and set(statuses) == {200}  # no client request failed during the failed rollout

        # a traffic-and-cache-only change applies without restarting the stable replica
        pids_before = sorted(
            r["pid"] for r in api.get(f"/api/2.0/serving-endpoints/{NAME}/replicas").json()["replicas"]
        )
        cache = api.put(
            f"/api/2.0/serving-endpoints/{NAME}/config",
            json={
                "served_entities": [{"name": "stable", "entity_name": MODEL_NAME, "entity_version": champion.version}],
                "response_cache": {"enabled": True, "ttl_seconds": 30},
            },
        )
        assert cache.status_code == 200
        _wait(api, lambda s: s == {"ready": "READY", "config_update": "NOT_UPDATING"})
        pids_after = sorted(r["pid"] for r in api.get(f"/api/2.0/serving-endpoints/{NAME}/replicas").json()["replicas"])
        # the replicas serving before still serve (the autoscaler may have added one for the traffic above)
        assert pids_before and set(pids_before) <= set(pids_after), "a cache-only change restarted the replicas"
        hits = [gateway.invoke(body, endpoint=NAME).headers.get("x-tollfree-cache") for _ in range(2)]
        assert hits == ["miss", "hit"]
        assert api.delete(f"/api/2.0/serving-endpoints/{NAME}").status_code == 200
