"""The Open Inference Protocol's REST routes on a real gateway process: Triton's HTTP client, unchanged, against the
session's endpoint (the demo model, which reads its features online) and a model of mixed column types, with binary
tensor data on (tritonclient's default) and off; its answers equal the MLflow route's for the same rows (over
generated frames too); the metadata names inputs and outputs; bad input is a 400 or 404 naming it."""

from __future__ import annotations

import httpx
import numpy as np
import pandas as pd
import pytest
import tritonclient.http as triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from tests.gateways import ENDPOINT, LiveGateway, create
from tests.models import register_mixed_columns_model
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

MIXED = "oip-mixed"


@pytest.fixture(scope="module")
def mixed(gateway: LiveGateway, world) -> str:  # type: ignore[no-untyped-def]
    """The mixed-columns model served by the endpoint ``oip-mixed``; its version."""
    version = register_mixed_columns_model(world.settings.tracking_uri, MIXED, MODEL_NAME)
    create(gateway.process, MIXED, {"entity_name": MIXED, "entity_version": version})
    return version


@pytest.fixture(scope="module")
def client(gateway: LiveGateway):  # type: ignore[no-untyped-def]
    with_client = triton.InferenceServerClient(url=gateway.url.removeprefix("http://"), network_timeout=60)
    yield with_client
    with_client.close()


def _auth(gateway: LiveGateway) -> dict[str, str]:
    return {"Authorization": f"Bearer {gateway.admin}"}


def _mlflow(gateway: LiveGateway, name: str, frame: pd.DataFrame) -> list:
    """The MLflow route's predictions for ``frame``."""
    body = {"dataframe_split": frame.to_dict(orient="split", index=False)}  # every digit (to_json rounds)
    with gateway.client(gateway.admin) as http:
        answer = http.post(f"/serving-endpoints/{name}/invocations", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["predictions"]


def _column(name: str, values: np.ndarray, datatype: str, binary: bool) -> triton.InferInput:
    tensor = triton.InferInput(name, [len(values)], datatype)
    tensor.set_data_from_numpy(values, binary_data=binary)
    return tensor


def _frame_inputs(frame: pd.DataFrame, binary: bool) -> list[triton.InferInput]:
    return [
        _column("amount", frame["amount"].to_numpy(np.float64), "FP64", binary),
        _column("count", frame["count"].to_numpy(np.int64), "INT64", binary),
        _column("flag", frame["flag"].to_numpy(np.bool_), "BOOL", binary),
        _column("city", np.array([c.encode() for c in frame["city"]], dtype=np.object_), "BYTES", binary),
    ]


def test_the_server_and_each_model_answer_health_metadata_and_readiness(gateway, client, mixed) -> None:  # type: ignore[no-untyped-def]
    headers = _auth(gateway)
    assert client.is_server_live(headers=headers) and client.is_server_ready(headers=headers)
    server = client.get_server_metadata(headers=headers)
    assert server["name"] == "tollfree" and "binary_tensor_data" in server["extensions"]
    assert client.is_model_ready(MIXED, headers=headers) and client.is_model_ready(MIXED, mixed, headers=headers)
    metadata = client.get_model_metadata(MIXED, headers=headers)
    assert metadata["versions"] == [mixed]
    assert metadata["inputs"] == [
        {"name": "amount", "datatype": "FP64", "shape": [-1]},
        {"name": "count", "datatype": "INT64", "shape": [-1]},
        {"name": "flag", "datatype": "BOOL", "shape": [-1]},
        {"name": "city", "datatype": "BYTES", "shape": [-1]},
    ]
    assert metadata["outputs"] == [{"name": "predictions", "datatype": "FP64", "shape": [-1]}]
    demo = client.get_model_metadata(ENDPOINT, headers=headers)  # a FeatureService model: its keys and request fields
    assert {i["name"] for i in demo["inputs"]} == {"customer_id", "merchant_id", "amount"}
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        assert http.get("/v2").status_code == 401  # no token
        assert http.get(f"/v2/models/{MIXED}", headers={"Authorization": f"Bearer {gateway.scoped}"}).status_code == 403


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritons_client_gets_the_mlflow_routes_predictions_for_mixed_columns(gateway, client, mixed, binary) -> None:  # type: ignore[no-untyped-def]
    frame = pd.DataFrame(
        {"amount": [1.5, -2.25, 10.0], "count": [3, 0, 7], "flag": [True, False, True], "city": ["Oslo", "", "Lima"]}
    )
    wanted = triton.InferRequestedOutput("predictions", binary_data=binary)
    result = client.infer(
        MIXED, _frame_inputs(frame, binary), outputs=[wanted], headers=_auth(gateway), request_id="r-1"
    )
    assert result.get_response()["id"] == "r-1" and result.get_response()["model_version"] == mixed
    assert result.as_numpy("predictions").tolist() == _mlflow(gateway, MIXED, frame)
    pinned = client.infer(MIXED, _frame_inputs(frame, binary), model_version=mixed, headers=_auth(gateway))
    assert pinned.as_numpy("predictions").tolist() == _mlflow(gateway, MIXED, frame)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritons_client_scores_the_demo_model_as_the_mlflow_route_does(gateway, client, world, binary) -> None:  # type: ignore[no-untyped-def]
    from feature_repo import synthetic

    rows = synthetic.read_transactions(world.settings.data_dir).sample(5, random_state=3)
    frame = rows[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)
    inputs = [
        _column("customer_id", frame["customer_id"].to_numpy(np.int64), "INT64", binary),
        _column("merchant_id", frame["merchant_id"].to_numpy(np.int64), "INT64", binary),
        _column("amount", frame["amount"].to_numpy(np.float64), "FP64", binary),
    ]
    result = client.infer(ENDPOINT, inputs, headers=_auth(gateway))
    (output,) = result.get_response()["outputs"]
    assert result.as_numpy(output["name"]).tolist() == _mlflow(gateway, ENDPOINT, frame)


FRAMES = st.integers(min_value=1, max_value=20).flatmap(
    lambda n: st.fixed_dictionaries(
        {
            "amount": st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=64), min_size=n, max_size=n),
            "count": st.lists(st.integers(-(2**40), 2**40), min_size=n, max_size=n),
            "flag": st.lists(st.booleans(), min_size=n, max_size=n),
            "city": st.lists(st.text(max_size=12), min_size=n, max_size=n),
        }
    )
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=FRAMES, binary=st.booleans())
def test_any_frame_gets_the_same_predictions_on_both_routes(gateway, client, mixed, columns, binary) -> None:  # type: ignore[no-untyped-def]
    frame = pd.DataFrame(columns)
    result = client.infer(MIXED, _frame_inputs(frame, binary), headers=_auth(gateway))
    assert result.as_numpy("predictions").tolist() == _mlflow(gateway, MIXED, frame)


@pytest.mark.parametrize(
    ("path", "inputs", "status", "named"),
    [
        ("infer", [{"name": "amount", "datatype": "BYTES", "shape": [1], "data": ["SECRET-1"]}], 400, "datatype BYTES"),
        ("infer", [{"name": "amount", "datatype": "FP64", "shape": [2], "data": [91.5]}], 400, "shape [2] needs 2"),
        (
            "infer",
            [{"name": "SECRET-NAME-LONG" * 8, "datatype": "FP64", "shape": [1], "data": [1.0]}],
            400,
            "not an input",
        ),
        ("infer", [{"name": "amount", "datatype": "FP64", "shape": [1], "data": [91.5]}], 400, "'count' is missing"),
        (
            "versions/999/infer",
            [{"name": "amount", "datatype": "FP64", "shape": [1], "data": [1.0]}],
            404,
            "version '999'",
        ),
    ],
)
def test_bad_input_is_refused_naming_it_and_echoing_nothing(gateway, mixed, path, inputs, status, named) -> None:  # type: ignore[no-untyped-def]
    with gateway.client(gateway.admin) as http:
        answer = http.post(f"/v2/models/{MIXED}/{path}", json={"inputs": inputs})
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]
    assert named in message and "SECRET-1" not in message and "91.5" not in message
    assert "SECRET-NAME-LONG" * 8 not in message
    with pytest.raises(InferenceServerException, match="no version"):
        triton.InferenceServerClient(url=gateway.url.removeprefix("http://")).get_model_metadata(
            MIXED, "999", headers=_auth(gateway)
        )
