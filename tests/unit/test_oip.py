"""The Open Inference Protocol's conversion: tensors (JSON, nested or flat, and the binary data extension) to the
MLflow route's rows, predictions back to output tensors, and the errors that name what is wrong."""

from __future__ import annotations

import struct

import numpy as np
import orjson
import pytest

from serving.protocol import oip
from serving.protocol.columns import Column, ModelIO
from serving.protocol.errors import ApiError

MIXED = ModelIO(
    inputs=(Column("amount", "double"), Column("count", "long"), Column("flag", "boolean"), Column("city", "string")),
    outputs=(Column("predictions", "long"),),
)
MATRIX = ModelIO(inputs=(Column("a", "double"), Column("b", "double"), Column("c", "double")), outputs=())


def _split(body: bytes) -> dict:
    return orjson.loads(body)["dataframe_split"]


def _request(inputs: list[dict], **extra) -> bytes:  # type: ignore[no-untyped-def]
    return orjson.dumps({"inputs": inputs, **extra})


def test_named_columns_become_the_mlflow_rows_in_the_signatures_order() -> None:
    body = _request(
        [
            {"name": "city", "datatype": "BYTES", "shape": [2], "data": ["Oslo", "Lima"]},
            {"name": "flag", "datatype": "BOOL", "shape": [2, 1], "data": [[True], [False]]},
            {"name": "count", "datatype": "INT32", "shape": [2], "data": [3, 4]},
            {"name": "amount", "datatype": "FP64", "shape": [2], "data": [1.5, 2.0]},
        ],
        id="req-7",
    )
    request = oip.parse_infer(body, None)
    assert request.id == "req-7" and request.rows == 2
    assert _split(oip.scoring_body(request, MIXED)) == {
        "columns": ["amount", "count", "flag", "city"],
        "data": [[1.5, 3, True, "Oslo"], [2.0, 4, False, "Lima"]],
    }


def test_one_matrix_input_of_as_many_columns_is_split_in_the_signatures_order() -> None:
    body = _request([{"name": "input-0", "datatype": "FP32", "shape": [2, 3], "data": [[1, 2, 3], [4, 5, 6]]}])
    assert _split(oip.scoring_body(oip.parse_infer(body, None), MATRIX)) == {
        "columns": ["a", "b", "c"],
        "data": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
    }


def test_binary_tensors_after_the_json_header_are_read_by_their_sizes() -> None:
    amounts = np.array([1.25, -3.5], dtype="<f8").tobytes()
    cities = b"".join(struct.pack("<I", len(s)) + s for s in (b"Oslo", b"Lima"))
    head = _request(
        [
            {"name": "amount", "datatype": "FP64", "shape": [2], "parameters": {"binary_data_size": len(amounts)}},
            {"name": "count", "datatype": "INT64", "shape": [2], "data": [1, 2]},
            {"name": "flag", "datatype": "BOOL", "shape": [2], "parameters": {"binary_data_size": 2}},
            {"name": "city", "datatype": "BYTES", "shape": [2], "parameters": {"binary_data_size": len(cities)}},
        ]
    )
    body = head + amounts + b"\x01\x00" + cities
    rows = _split(oip.scoring_body(oip.parse_infer(body, len(head)), MIXED))["data"]
    assert rows == [[1.25, 1, True, "Oslo"], [-3.5, 2, False, "Lima"]]


@pytest.mark.parametrize(
    ("inputs", "named"),
    [
        ([{"name": "amount", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "datatype BYTES does not fit"),
        ([{"name": "count", "datatype": "FP64", "shape": [1], "data": [1.5]}], "datatype FP64 does not fit"),
        ([{"name": "amount", "datatype": "FP64", "shape": [2], "data": [1.0]}], "holds 1 elements but shape [2]"),
        ([{"name": "amount", "datatype": "FP64", "shape": [1], "data": [[1.0, 2.0], [3.0]]}], "ragged"),
        ([{"name": "nope", "datatype": "FP64", "shape": [1], "data": [1.0]}], "input 'nope' is not an input"),
        ([{"name": "amount", "datatype": "FP64", "shape": [1], "data": [1.0]}], "input 'count' is missing"),
        ([{"name": "amount", "datatype": "FP99", "shape": [1], "data": [1.0]}], "datatype must be one of"),
        ([{"name": "amount", "datatype": "INT8", "shape": [1], "data": [300]}], "out of the range of INT8"),
        ([{"name": "amount", "datatype": "BOOL", "shape": [1], "data": [1]}], "does not hold BOOL values"),
        ([{"name": "amount", "datatype": "FP64", "shape": [-1], "data": [1.0]}], "shape must be"),
        ([{"name": "amount", "datatype": "FP64", "shape": [1, 2], "data": [1.0, 2.0]}], "is not a column"),
    ],
)
def test_a_bad_input_is_a_400_naming_it_without_its_values(inputs: list[dict], named: str) -> None:
    with pytest.raises(ApiError) as caught:
        oip.scoring_body(oip.parse_infer(_request(inputs), None), MIXED)
    assert caught.value.status_code == 400 and named in caught.value.message, caught.value.message
    assert "300" not in caught.value.message and "1.5" not in caught.value.message


@pytest.mark.parametrize(
    ("body", "length", "named"),
    [
        (b"not json", None, "not a JSON inference request"),
        (b"[]", None, "JSON object with inputs"),
        (b'{"inputs": []}', None, "non-empty list"),
        (b'{"inputs": [{"name": "a", "datatype": "FP64", "shape": [1]}]}', None, "data is required"),
        (b'{"inputs": [{"name": "a", "datatype": "FP64", "shape": [1], "data": [1]}], "id": 3}', None, "id must be"),
        (b'{"inputs": [{"name": "a", "datatype": "FP64", "shape": [1], "data": [1]}]}', 999, "between 1 and"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_problem(body: bytes, length: int | None, named: str) -> None:
    with pytest.raises(ApiError) as caught:
        oip.parse_infer(body, length)
    assert caught.value.status_code == 400 and named in caught.value.message


def test_binary_data_that_does_not_match_its_shape_is_refused() -> None:
    head = _request([{"name": "a", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 8}}])
    with pytest.raises(ApiError, match="holds 8 bytes but shape \\[3\\] of FP32 needs 12"):
        oip.parse_infer(head + b"\x00" * 8, len(head))
    whole = _request([{"name": "a", "datatype": "FP32", "shape": [3], "parameters": {"binary_data_size": 12}}])
    with pytest.raises(ApiError, match="no input claims"):
        oip.parse_infer(whole + b"\x00" * 12 + b"extra", len(whole))


def test_predictions_come_back_as_tensors_named_and_typed_by_the_signature() -> None:
    request = oip.parse_infer(_request([{"name": "a", "datatype": "FP64", "shape": [2], "data": [1, 2]}], id="x"), None)
    body, length = oip.infer_response(b"[0, 1]", request, "fraud", "3", MIXED)
    assert length is None
    assert orjson.loads(body) == {
        "model_name": "fraud",
        "model_version": "3",
        "id": "x",
        "outputs": [{"name": "predictions", "datatype": "INT64", "shape": [2], "data": [0, 1]}],
    }


def test_rows_records_and_columns_of_predictions_become_shaped_tensors() -> None:
    request = oip.parse_infer(_request([{"name": "a", "datatype": "FP64", "shape": [2], "data": [1, 2]}]), None)
    (out,) = orjson.loads(oip.infer_response(b"[[0.1, 0.9], [0.8, 0.2]]", request, "m", None, MATRIX)[0])["outputs"]
    assert out == {"name": "predictions", "datatype": "FP64", "shape": [2, 2], "data": [0.1, 0.9, 0.8, 0.2]}
    records = b'[{"label": "a", "score": 0.5}, {"label": "b", "score": 0.25}]'
    outs = orjson.loads(oip.infer_response(records, request, "m", None, MATRIX)[0])["outputs"]
    assert outs == [
        {"name": "label", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]},
        {"name": "score", "datatype": "FP64", "shape": [2], "data": [0.5, 0.25]},
    ]


def test_outputs_asked_as_binary_follow_the_json_header() -> None:
    inputs = [{"name": "a", "datatype": "FP64", "shape": [2], "data": [1, 2]}]
    asked = oip.parse_infer(
        _request(inputs, outputs=[{"name": "predictions", "parameters": {"binary_data": True}}]), None
    )
    body, length = oip.infer_response(b"[5, 6]", asked, "m", "1", MIXED)
    assert length is not None
    head = orjson.loads(body[:length])
    assert head["outputs"] == [
        {"name": "predictions", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 16}}
    ]
    assert np.frombuffer(body[length:], dtype="<i8").tolist() == [5, 6]
    everything = oip.parse_infer(_request(inputs, parameters={"binary_data_output": True}), None)
    assert oip.infer_response(b"[5, 6]", everything, "m", "1", MIXED)[1] is not None


def test_an_output_the_model_does_not_give_is_refused_before_scoring() -> None:
    inputs = [{"name": "a", "datatype": "FP64", "shape": [1], "data": [1]}]
    with pytest.raises(ApiError, match="output 'proba' is not an output of the model"):
        oip.check_outputs(oip.parse_infer(_request(inputs, outputs=[{"name": "proba"}]), None), MIXED)


def test_metadata_lists_inputs_and_outputs_with_datatypes_and_variable_rows() -> None:
    io = ModelIO(inputs=(Column("x", "double"), Column("img", "float32", 4)), outputs=(Column("predictions", "long"),))
    assert oip.model_metadata("m", ["2"], io) == {
        "name": "m",
        "versions": ["2"],
        "platform": "mlflow",
        "inputs": [
            {"name": "x", "datatype": "FP64", "shape": [-1]},
            {"name": "img", "datatype": "FP32", "shape": [-1, 4]},
        ],
        "outputs": [{"name": "predictions", "datatype": "INT64", "shape": [-1]}],
    }


def test_a_grpc_request_reads_typed_contents_and_raw_inputs_alike() -> None:
    from serving.protocol import oip_grpc
    from serving.protocol.tensors import to_binary
    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    typed = pb.ModelInferRequest(model_name="m", id="a")
    typed.inputs.add(name="count", datatype="INT8", shape=[2]).contents.int_contents.extend([3, -4])
    typed.inputs.add(name="city", datatype="BYTES", shape=[2, 1]).contents.bytes_contents.extend([b"Oslo", b"x"])
    raw = pb.ModelInferRequest(model_name="m", id="a")
    raw.inputs.add(name="count", datatype="INT8", shape=[2])
    raw.inputs.add(name="city", datatype="BYTES", shape=[2, 1])
    raw.raw_input_contents.extend(
        [to_binary("INT8", np.array([3, -4])), to_binary("BYTES", np.array([b"Oslo", b"x"], dtype=object))]
    )
    for message in (typed, raw):
        request = oip_grpc.request_from_message(message)
        assert request.id == "a" and request.rows == 2
        assert [t.values.tolist() for t in request.inputs] == [[3, -4], [b"Oslo", b"x"]]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: m.inputs[0].contents.int_contents.__setitem__(0, 300), "out of the range of INT8"),
        (lambda m: m.inputs[0].contents.int_contents.append(1), "needs 1"),
        (lambda m: setattr(m.inputs[0], "datatype", "FP16"), "must come in raw_input_contents"),
        (lambda m: (m.inputs[0].ClearField("contents"), m.raw_input_contents.extend([b"\x01"] * 2)), "one per input"),
        (lambda m: m.inputs.append(m.inputs[0]), "distinct names"),
        (lambda m: m.raw_input_contents.append(b"\x01"), "cannot both carry data"),
    ],
)
def test_a_bad_grpc_request_is_refused_naming_what_is_wrong(change, named) -> None:  # type: ignore[no-untyped-def]
    from serving.protocol import oip_grpc
    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    message = pb.ModelInferRequest(model_name="m")
    message.inputs.add(name="count", datatype="INT8", shape=[1]).contents.int_contents.append(5)
    change(message)
    with pytest.raises(ApiError, match=named) as refused:
        oip_grpc.request_from_message(message)
    assert refused.value.status_code == 400


def test_a_grpc_response_carries_the_outputs_raw() -> None:
    from serving.protocol import oip_grpc
    from serving.protocol.tensors import from_binary

    request = oip.parse_infer(
        orjson.dumps({"id": "r", "inputs": [{"name": "a", "datatype": "FP64", "shape": [2], "data": [1, 2]}]}), None
    )
    outputs = oip.output_tensors(b"[0, 1]", request, MIXED)
    response = oip_grpc.infer_response(outputs, request, "m", "4")
    assert (response.model_name, response.model_version, response.id) == ("m", "4", "r")
    (out,) = response.outputs
    assert (out.name, out.datatype, list(out.shape)) == ("predictions", "INT64", [2])
    assert from_binary("o", "INT64", (2,), response.raw_output_contents[0]).tolist() == [0, 1]
