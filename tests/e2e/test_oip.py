"""The Open Inference Protocol's REST routes on a real gateway process: Triton's HTTP client, unchanged, against the
session's endpoint (the demo model, which reads its features online) and a model of mixed column types, with binary
tensor data on (tritonclient's default) and off; its answers equal the MLflow route's for the same rows (over
generated frames too); the metadata names inputs and outputs; bad input is a 400 or 404 naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pandas as pd
import pytest
import tritonclient.http as triton
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from serving.settings import PROJECT_DIR
from tests.e2e import oip_conformance as conformance
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


def _cases(gateway: LiveGateway, world, mixed: str) -> dict:  # type: ignore[no-untyped-def]
    """Both models with columns of rows to send and the MLflow route's predictions for them (the clients' input)."""
    from feature_repo import synthetic

    frame = pd.DataFrame(
        {"amount": [1.5, -2.25, 10.0], "count": [3, 0, 7], "flag": [True, False, True], "city": ["Oslo", "", "Lima"]}
    )
    demo = synthetic.read_transactions(world.settings.data_dir).sample(4, random_state=5)
    demo = demo[["customer_id", "merchant_id", "amount"]].reset_index(drop=True)
    types = {"amount": "FP64", "count": "INT64", "flag": "BOOL", "city": "BYTES", "customer_id": "INT64"}
    types["merchant_id"] = "INT64"
    models = []
    for name, rows in ((MIXED, frame), (ENDPOINT, demo)):
        with gateway.client(gateway.admin) as http:
            metadata = http.get(f"/v2/models/{name}").json()
        version = metadata["versions"][0]
        columns = [{"name": c, "datatype": types[c], "values": rows[c].tolist()} for c in rows.columns]
        output = metadata["outputs"][0]["name"] if metadata["outputs"] else "predictions"
        expected = _mlflow(gateway, name, rows)
        models.append({"name": name, "version": version, "inputs": columns, "output": output, "expected": expected})
    return {"rest": gateway.url, "grpc": gateway.grpc, "token": gateway.admin, "models": models}


def test_every_official_client_passes_every_route_and_method_it_offers(gateway, world, mixed, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Triton's and KServe's clients, REST and gRPC, each mode: every route and method answers, inference gives the
    MLflow route's predictions. The matrix this makes is the documentation's (docs/reference/oip-conformance.json):
    a run that differs from it fails, and TOLLFREE_WRITE_CONFORMANCE=1 writes it."""
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps(_cases(gateway, world, mixed)))
    runs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.oip_clients", name, str(cases)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=PROJECT_DIR,
        )
        for name in conformance.CLIENTS
    }
    results = []
    for name, run in runs.items():
        out, err = run.communicate(timeout=300)
        assert run.returncode == 0, f"{name}: {err.decode()[-2000:]}"
        results += json.loads(out)
    failed = [r for r in results if not r["passed"]]
    assert not failed, "\n".join(f"{r['client']} ({r['mode']}) {r['operation']}: {r['detail']}" for r in failed)
    matrix = conformance.matrix(results)
    if os.environ.get("TOLLFREE_WRITE_CONFORMANCE") == "1":
        conformance.write(matrix, conformance.client_versions())
    assert conformance.cells(conformance.read()) == conformance.cells(matrix), (
        "the conformance matrix changed: run this test with TOLLFREE_WRITE_CONFORMANCE=1 and commit "
        "docs/reference/oip-conformance.json"
    )


@pytest.fixture(scope="module")
def stub(gateway: LiveGateway):  # type: ignore[no-untyped-def]
    """The gateway's gRPC service through the stubs compiled from the specification's proto."""
    import grpc

    from serving.protocol.v2 import grpc_predict_v2_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(gateway.grpc)
    yield pb_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


def _grpc_request(name: str, frame: pd.DataFrame, raw: bool, version: str = ""):  # type: ignore[no-untyped-def]
    from serving.protocol.tensors import to_binary
    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=name, model_version=version, id="g-1")
    columns = {
        "amount": ("FP64", frame["amount"].to_numpy(np.float64), "fp64_contents"),
        "count": ("INT64", frame["count"].to_numpy(np.int64), "int64_contents"),
        "flag": ("BOOL", frame["flag"].to_numpy(np.bool_), "bool_contents"),
        "city": ("BYTES", np.array([c.encode() for c in frame["city"]], dtype=object), "bytes_contents"),
    }
    for column, (datatype, values, field) in columns.items():
        tensor = request.inputs.add(name=column, datatype=datatype, shape=[len(values)])
        if raw:
            request.raw_input_contents.append(to_binary(datatype, values))
        else:
            getattr(tensor.contents, field).extend(values.tolist())
    return request


def _grpc_predictions(response) -> list:  # type: ignore[no-untyped-def]
    from serving.protocol.tensors import from_binary

    (output,) = response.outputs
    values = from_binary("out", output.datatype, tuple(output.shape), response.raw_output_contents[0])
    return values.tolist()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=FRAMES, raw=st.booleans())
def test_any_frame_gets_the_same_predictions_over_grpc(gateway, stub, mixed, columns, raw) -> None:  # type: ignore[no-untyped-def]
    frame = pd.DataFrame(columns)
    metadata = (("authorization", f"Bearer {gateway.admin}"),)
    response = stub.ModelInfer(_grpc_request(MIXED, frame, raw), metadata=metadata, timeout=60)
    assert response.id == "g-1" and response.model_version == mixed
    assert _grpc_predictions(response) == _mlflow(gateway, MIXED, frame)


def test_grpc_refuses_bad_input_and_strangers_with_the_status_naming_it(gateway, stub, mixed) -> None:  # type: ignore[no-untyped-def]
    import grpc

    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    admin = (("authorization", f"Bearer {gateway.admin}"),)
    frame = pd.DataFrame({"amount": [91.5], "count": [1], "flag": [True], "city": ["SECRET-1"]})
    wrong_type = _grpc_request(MIXED, frame, raw=False)
    wrong_type.inputs[0].datatype = "BYTES"
    wrong_type.inputs[0].contents.bytes_contents.append(b"SECRET-1")
    del wrong_type.inputs[0].contents.fp64_contents[:]
    short = _grpc_request(MIXED, frame, raw=True)
    short.inputs[0].shape[:] = [2]
    unknown = _grpc_request(MIXED, frame, raw=False)
    unknown.inputs[3].name = "no-such-input"
    missing = _grpc_request(MIXED, frame, raw=False)
    del missing.inputs[1]
    half_raw = _grpc_request(MIXED, frame, raw=True)
    del half_raw.raw_input_contents[-1]
    fp16 = pb.ModelInferRequest(model_name=MIXED)
    fp16.inputs.add(name="amount", datatype="FP16", shape=[1])
    cases = [
        (wrong_type, admin, grpc.StatusCode.INVALID_ARGUMENT, "datatype BYTES"),
        (short, admin, grpc.StatusCode.INVALID_ARGUMENT, "shape [2]"),
        (unknown, admin, grpc.StatusCode.INVALID_ARGUMENT, "'no-such-input' is not an input"),
        (missing, admin, grpc.StatusCode.INVALID_ARGUMENT, "'count' is missing"),
        (half_raw, admin, grpc.StatusCode.INVALID_ARGUMENT, "one per input"),
        (fp16, admin, grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents"),
        (_grpc_request(MIXED, frame, True, "999"), admin, grpc.StatusCode.NOT_FOUND, "version '999'"),
        (_grpc_request(MIXED, frame, raw=True), (), grpc.StatusCode.UNAUTHENTICATED, "token"),
        (
            _grpc_request(MIXED, frame, raw=True),
            (("authorization", f"Bearer {gateway.scoped}"),),
            grpc.StatusCode.PERMISSION_DENIED,
            MIXED,
        ),
    ]
    for request, metadata, status, named in cases:
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(request, metadata=metadata, timeout=60)
        assert refused.value.code() == status, refused.value.details()
        assert named in refused.value.details(), refused.value.details()
        assert "SECRET" not in refused.value.details() and "91.5" not in refused.value.details()
    for call, message in ((stub.ModelMetadata, pb.ModelMetadataRequest), (stub.ModelReady, pb.ModelReadyRequest)):
        with pytest.raises(grpc.RpcError) as refused:
            call(message(name=MIXED), metadata=(("authorization", f"Bearer {gateway.scoped}"),), timeout=60)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as refused:
        stub.ServerLive(pb.ServerLiveRequest(), timeout=60)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


TENSORS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["amount", "count", "flag", "city", "", "x" * 70]),
        "datatype": st.sampled_from(["FP64", "INT64", "BOOL", "BYTES", "FP16", "UINT8", "INT8", "nope"]),
        "shape": st.lists(st.integers(-1, 4), max_size=3),
        "ints": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
        "raw": st.binary(max_size=24),
    }
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tensors=st.lists(TENSORS, max_size=4), use_raw=st.booleans(), version=st.sampled_from(["", "1", "x/y"]))
def test_fuzzed_grpc_requests_get_no_server_error(gateway, stub, mixed, tensors, use_raw, version) -> None:  # type: ignore[no-untyped-def]
    import grpc

    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name=MIXED, model_version=version)
    for t in tensors:
        tensor = request.inputs.add(name=t["name"], datatype=t["datatype"])
        try:
            tensor.shape.extend(t["shape"])
        except ValueError:
            pass
        if use_raw:
            request.raw_input_contents.append(t["raw"])
        else:
            tensor.contents.int_contents.extend(t["ints"])
    try:
        stub.ModelInfer(request, metadata=(("authorization", f"Bearer {gateway.admin}"),), timeout=60)
    except grpc.RpcError as err:
        assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err.details()
