"""The gateway and a replica as real processes on loopback, driven over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime

import mlflow
import numpy as np
import pandas as pd
import pytest

from feature_repo import store as feature_store
from feature_repo import synthetic
from flows import training
from serving.inference_log import read_inference_log
from tests.gateways import replicas_of
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def request_rows(world) -> pd.DataFrame:
    tx = synthetic.read_transactions(world.settings.data_dir)
    return tx.sample(12, random_state=3)[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)


def test_online_prediction_equals_pyfunc_on_offline_features(world, gateway, request_rows):
    reply = gateway.invoke({"dataframe_split": request_rows.to_dict(orient="split", index=False)})
    assert reply.status_code == 200, reply.text
    assert reply.headers["served-model-name"] == f"{MODEL_NAME}-champion"
    online = np.asarray(reply.json()["predictions"])

    store = feature_store.open_store(world.home)
    now = pd.Timestamp(datetime.now(UTC)).floor("us")
    entities = request_rows.assign(event_timestamp=now, transaction_id=np.arange(len(request_rows)))
    offline = training.historical_features(store, "fraud_v1", entities)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")
    expected = np.asarray(model.predict(offline[list(model.metadata.get_input_schema().input_names())]))
    np.testing.assert_allclose(online, expected, rtol=1e-9)


def test_after_its_first_envelope_the_gateway_reaches_its_replica_through_the_frame_socket(gateway, request_rows):
    body = {"dataframe_split": request_rows.head(2).to_dict(orient="split", index=False)}
    for _ in range(3):
        assert gateway.invoke(body).status_code == 200
    (replica,) = replicas_of(gateway.process)
    # psutil before 6 (the KServe SDK of the dev group pins psutil < 6) calls net_connections connections
    connections = getattr(replica, "net_connections", None) or replica.connections
    on_frame_socket = [c for c in connections(kind="unix") if c.laddr.startswith("@tollfree/replica/")]
    assert len(on_frame_socket) >= 2, (
        f"the frame socket's listener and the gateway's connection to it: {on_frame_socket}"
    )


def test_every_scoring_format_gives_the_same_predictions(gateway, request_rows):
    rows = request_rows.head(3)
    records = rows.to_dict(orient="records")
    bodies = [
        ({"dataframe_records": records}, "application/json"),
        ({"instances": records}, "application/json"),
        ({"inputs": {c: rows[c].tolist() for c in rows.columns}}, "application/json"),
        (rows.to_csv(index=False), "text/csv"),
    ]
    answers = []
    for body, content_type in bodies:
        reply = gateway.invoke(body, content_type=content_type)
        assert reply.status_code == 200, reply.text
        answers.append(reply.json()["predictions"])
    assert all(a == answers[0] for a in answers)


def test_tokens_are_required_and_scoped(gateway, request_rows):
    body = {"dataframe_records": request_rows.head(1).to_dict(orient="records")}
    assert gateway.invoke(body, token="").status_code == 401
    assert gateway.invoke(body, token="not-a-real-token-at-all").status_code == 401
    denied = gateway.invoke(body, token=gateway.scoped)
    assert denied.status_code == 403 and denied.json()["error_code"] == "PERMISSION_DENIED"
    with gateway.client(gateway.scoped) as client:
        assert (
            client.post("/api/2.0/serving-endpoints", json={"name": "x", "config": {"served_entities": []}}).status_code
            == 403
        )
        assert client.get("/api/2.0/serving-endpoints/fraud").status_code == 403
        assert client.get("/api/2.0/serving-endpoints").json() == {"endpoints": []}
    with gateway.client() as client:
        assert client.get("/api/2.0/serving-endpoints").status_code == 401
        assert client.get("/metrics").status_code == 401


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code", "named"),
    [
        (
            '{"dataframe_records": [{"customer_id": 1, "SECRET-VALUE-1"',
            "application/json",
            400,
            "MALFORMED_REQUEST",
            "JSON",
        ),
        (
            {"dataframe_records": [{"customer_id": 1, "merchant_id": 1}]},
            "application/json",
            400,
            "INVALID_PARAMETER_VALUE",
            "amount",
        ),
        (
            {"dataframe_records": [{"customer_id": 1, "merchant_id": 1, "amount": "SECRET-VALUE-2"}]},
            "application/json",
            400,
            "INVALID_PARAMETER_VALUE",
            "amount",
        ),
        (
            {"dataframe_records": [{"customer_id": 10**9, "merchant_id": 1, "amount": 5.0}]},
            "application/json",
            404,
            "RESOURCE_DOES_NOT_EXIST",
            "customer_id",
        ),
        ({"records": []}, "application/json", 400, "INVALID_PARAMETER_VALUE", "dataframe_split"),
        ("customer_id=1", "application/x-www-form-urlencoded", 415, "BAD_REQUEST", "content type"),
    ],
)
def test_bad_input_gets_a_clear_error_without_echo(gateway, body, content_type, status, code, named):
    reply = gateway.invoke(body, content_type=content_type)
    assert reply.status_code == status, reply.text
    error = reply.json()
    assert error["error_code"] == code
    assert named in error["message"]
    assert "SECRET-VALUE" not in reply.text


def test_unknown_endpoint_and_oversized_body(gateway):
    missing = gateway.invoke({"dataframe_records": [{"a": 1}]}, endpoint="no-such-endpoint")
    assert missing.status_code == 404 and missing.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"
    huge = gateway.invoke(b'{"dataframe_records": [' + b'{"a": 1},' * 600_000 + b'{"a": 1}]}')
    assert huge.status_code == 413


def test_control_plane_errors(gateway):
    with gateway.client(gateway.admin) as client:
        dup = client.post(
            "/api/2.0/serving-endpoints",
            json={
                "name": "fraud",
                "config": {"served_entities": [{"entity_name": MODEL_NAME, "entity_alias": "champion"}]},
            },
        )
        assert dup.status_code == 409 and dup.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
        no_alias = client.post(
            "/api/2.0/serving-endpoints",
            json={
                "name": "fraud2",
                "config": {"served_entities": [{"entity_name": MODEL_NAME, "entity_alias": "nope"}]},
            },
        )
        assert no_alias.status_code == 400 and "nope" in no_alias.json()["message"]
        bad_split = client.post(
            "/api/2.0/serving-endpoints",
            json={
                "name": "fraud3",
                "config": {
                    "served_entities": [
                        {"entity_name": MODEL_NAME, "entity_version": "1", "name": "a"},
                        {"entity_name": MODEL_NAME, "entity_version": "1", "name": "b"},
                    ],
                    "traffic_config": {
                        "routes": [
                            {"served_model_name": "a", "traffic_percentage": 50},
                            {"served_model_name": "b", "traffic_percentage": 40},
                        ]
                    },
                },
            },
        )
        assert bad_split.status_code == 400 and "100" in bad_split.json()["message"]
        assert client.get("/api/2.0/serving-endpoints/nope").status_code == 404
        names = [e["name"] for e in client.get("/api/2.0/serving-endpoints").json()["endpoints"]]
        assert "fraud" in names and "fraud2" not in names and "fraud3" not in names
        view = client.get("/api/2.0/serving-endpoints/fraud").json()
        assert view["state"] == {"ready": "READY", "config_update": "NOT_UPDATING"}
        assert view["config"]["served_entities"][0]["entity_version"] == "1"
        metrics = client.get("/metrics").text
        assert 'tollfree_requests_total{endpoint="fraud",served_entity="fraud-champion",status="200"}' in metrics


def test_every_request_of_the_shared_gateway_is_logged_rejected_ones_included(world, gateway):
    """The log is written off the request path within about a second; wait for it, then compare."""
    import time

    deadline = time.monotonic() + 10
    while True:
        log = read_inference_log(world.settings.inference_log_dir)
        missing = set(gateway.sent) - set(log["request_id"])
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert not missing
    rejected = log[log["request_id"].isin(gateway.sent) & (log["status_code"] != 200)]
    assert {401, 403, 400, 404, 413, 415} <= set(rejected["status_code"])


def test_logged_served_features_equal_offline_features_at_their_logged_time(world, gateway):
    """Every successful request's served features, recomputed offline at its logged time."""
    from feature_repo import store as feature_store
    from flows import feature_parity

    log = read_inference_log(world.settings.inference_log_dir, endpoint="fraud")
    rows = feature_parity.logged_rows(log)
    assert len(rows) >= 12
    result = feature_parity.parity_of(feature_store.open_store(world.home), "fraud_v1", rows)
    assert result.rows == len(rows) and result.mismatched() == [], result.table()
