"""The Open Inference Protocol ("v2": KServe's, Triton's, MLServer's) over the MLflow scoring protocol.

An inference request's tensors become the rows of an MLflow ``dataframe_split`` request, so a v2 request takes the
path of the MLflow route after it (admission, batching, the traffic split, the cache, the replica's parser and the
inference log, which keeps the rows as the MLflow route would) and gets the same predictions. The predictions come
back as output tensors. Inputs map to a model's columns (``serving.protocol.columns``) in one of two ways:

- one input per column, by name (the ``pd`` content type of MLServer and KServe: a column ``[n]`` or ``[n, 1]``);
- one input ``[n, k]`` for a model of ``k`` columns, in the signature's order (how Triton's clients send a matrix).

Pure: bytes and columns in, bytes out. Errors are ApiError 400 naming the input or output, never a value; the
gateway answers them as ``{"error": message}``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from serving.protocol.columns import PREDICTIONS, Column, ModelIO
from serving.protocol.errors import ApiError, invalid_parameter, malformed_request
from serving.protocol.tensors import (
    FLOATS,
    INTEGERS,
    Tensor,
    check_header,
    from_binary,
    from_json,
    infer_datatype,
    output_array,
    to_binary,
    to_json,
)

BINARY_HEADER = "inference-header-content-length"
BINARY_CONTENT_TYPE = "application/octet-stream"
# MLflow schema type (or a tensor's numpy dtype) -> the datatype metadata announces
DATATYPE_OF = {
    "long": "INT64",
    "integer": "INT32",
    "double": "FP64",
    "float": "FP32",
    "boolean": "BOOL",
    "string": "BYTES",
    "binary": "BYTES",
    "datetime": "BYTES",
    "int64": "INT64",
    "int32": "INT32",
    "float64": "FP64",
    "float32": "FP32",
    "bool": "BOOL",
}
NUMBERS = INTEGERS | FLOATS
# the datatypes a column of each MLflow type accepts: an integer column no float, any number column any integer
ACCEPTS = {
    "long": INTEGERS,
    "integer": INTEGERS,
    "int64": INTEGERS,
    "int32": INTEGERS,
    "double": NUMBERS,
    "float": NUMBERS,
    "float64": NUMBERS,
    "float32": NUMBERS,
    "boolean": frozenset({"BOOL"}),
    "bool": frozenset({"BOOL"}),
    "string": frozenset({"BYTES"}),
    "binary": frozenset({"BYTES"}),
    "datetime": frozenset({"BYTES"}),
}


@dataclass(frozen=True)
class InferRequest:
    id: str | None
    inputs: tuple[Tensor, ...]
    outputs: tuple[tuple[str, bool], ...] | None  # the outputs asked for, each with its binary flag; None: all
    binary_output: bool  # every output as binary data (``binary_data_output``)

    @property
    def rows(self) -> int:
        return self.inputs[0].rows


def parse_infer(body: bytes, header_length: int | None) -> InferRequest:
    """An inference request: its JSON (the first ``header_length`` bytes of ``body`` with the binary data
    extension, else all of it) and the binary tensors after it."""
    if header_length is not None and not 0 < header_length <= len(body):
        raise invalid_parameter(f"{BINARY_HEADER} must be between 1 and the body's length")
    head, binary = (body, b"") if header_length is None else (body[:header_length], body[header_length:])
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        raise malformed_request("the body is not a JSON inference request") from None
    if not isinstance(doc, dict):
        raise malformed_request("the body must be a JSON object with inputs")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise invalid_parameter("id must be a string")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise invalid_parameter("inputs must be a non-empty list of tensors")
    inputs, at = [], 0
    for i, item in enumerate(raw_inputs):
        tensor, at = _input(i, item, binary, at)
        inputs.append(tensor)
    if at != len(binary):
        raise invalid_parameter(f"the binary data holds {len(binary) - at} bytes no input claims")
    params = _parameters(doc, "the request")
    return infer_request(request_id, inputs, _requested(doc.get("outputs")), params.get("binary_data_output") is True)


def infer_request(
    request_id: str | None, inputs: Sequence[Tensor], outputs: tuple[tuple[str, bool], ...] | None, binary_output: bool
) -> InferRequest:
    """A request of these tensors, checked as one: distinct names, one number of rows."""
    if not inputs:
        raise invalid_parameter("inputs must be a non-empty list of tensors")
    if len({t.name for t in inputs}) != len(inputs):
        raise invalid_parameter("inputs must have distinct names")
    if len({t.rows for t in inputs}) != 1:
        raise invalid_parameter("every input must have the same first dimension (the rows)")
    return InferRequest(request_id, tuple(inputs), outputs, binary_output)


def _parameters(item: dict[str, Any], where: str) -> dict[str, Any]:
    params = item.get("parameters", {})
    if not isinstance(params, dict):
        raise invalid_parameter(f"{where}: parameters must be an object")
    return params


def _input(i: int, item: Any, binary: bytes, at: int) -> tuple[Tensor, int]:
    if not isinstance(item, dict):
        raise invalid_parameter(f"inputs[{i}] must be an object with name, datatype, shape and data")
    name, datatype, shape = check_header(f"input {i}", item.get("name"), item.get("datatype"), item.get("shape"))
    label = f"input {name[:64]!r}"
    size = _parameters(item, label).get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or at + size > len(binary):
            raise invalid_parameter(f"{label}: binary_data_size does not fit the binary data sent")
        return Tensor(name, datatype, shape, from_binary(label, datatype, shape, binary[at : at + size])), at + size
    if "data" not in item:
        raise invalid_parameter(f"{label}: data is required (or binary_data_size with the binary data extension)")
    return Tensor(name, datatype, shape, from_json(label, datatype, shape, item["data"])), at


def _requested(outputs: Any) -> tuple[tuple[str, bool], ...] | None:
    if outputs is None:
        return None
    if not isinstance(outputs, list) or not all(
        isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs
    ):
        raise invalid_parameter("outputs must be a list of objects with a name")
    return tuple((o["name"], _parameters(o, f"output {o['name'][:64]!r}").get("binary_data") is True) for o in outputs)


def check_outputs(request: InferRequest, io: ModelIO) -> None:
    """Outputs asked for that the model does not give are refused before anything is scored."""
    names = [c.name for c in io.outputs] or [PREDICTIONS]
    for name, _ in request.outputs or ():
        if name not in names:
            raise invalid_parameter(
                f"output {name[:64]!r} is not an output of the model (it gives: {', '.join(names)})"
            )


def scoring_body(request: InferRequest, io: ModelIO) -> bytes:
    """The MLflow ``dataframe_split`` request of the same rows, checked against the model's columns."""
    columns = io.inputs
    tensors = {t.name: t for t in request.inputs}
    if columns and not set(tensors) <= {c.name for c in columns}:
        if len(request.inputs) == 1 and request.inputs[0].width == len(columns) and len(columns) > 1:
            return _split_matrix(request.inputs[0], columns)
        unknown = next(name for name in tensors if name not in {c.name for c in columns})
        raise invalid_parameter(f"input {unknown[:64]!r} is not an input of the model (it takes: {_names(columns)})")
    by_name = {c.name: c for c in columns}
    given = {name: _column_values(tensor, by_name.get(name)) for name, tensor in tensors.items()}
    missing = [c.name for c in columns if c.name not in tensors]
    if missing:
        raise invalid_parameter(f"input {missing[0]!r} is missing (the model takes: {_names(columns)})")
    names = [c.name for c in columns] if columns else list(tensors)
    values = [given[n] for n in names]
    return orjson.dumps({"dataframe_split": {"columns": names, "data": [list(row) for row in zip(*values)]}})


def _split_matrix(tensor: Tensor, columns: Sequence[Column]) -> bytes:
    label = f"input {tensor.name[:64]!r}"
    for column in columns:
        _check_type(label, tensor.datatype, column)
    rows = tensor.values.reshape(tensor.rows, len(columns)).tolist()
    if tensor.datatype == "BYTES":  # numbers and booleans go as they are
        rows = [[_plain(v, c) for v, c in zip(row, columns)] for row in rows]
    return orjson.dumps({"dataframe_split": {"columns": [c.name for c in columns], "data": rows}})


def _column_values(tensor: Tensor, column: Column | None) -> list[Any]:
    label = f"input {tensor.name[:64]!r}"
    if column is not None:
        _check_type(label, tensor.datatype, column)
    if tensor.width != 1:
        raise invalid_parameter(f"{label}: shape {list(tensor.shape)} is not a column ([n] or [n, 1])")
    values = tensor.values.tolist()
    return [_plain(v, column) for v in values] if tensor.datatype == "BYTES" else values


def _check_type(label: str, datatype: str, column: Column) -> None:
    accepted = ACCEPTS.get(column.type)
    if accepted is not None and datatype not in accepted:
        raise invalid_parameter(
            f"{label}: datatype {datatype} does not fit the model's {column.type} column {column.name[:64]!r}"
        )


def _plain(value: Any, column: Column | None) -> Any:
    """A value as the MLflow route's JSON carries it: text for a string column, base64 for a binary one."""
    if isinstance(value, bytes):
        if column is not None and column.type == "binary":
            return base64.b64encode(value).decode()
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise invalid_parameter(
                f"a BYTES value for {repr(column.name[:64]) if column else 'an input'} is not UTF-8 text"
            ) from None
    return value


def _names(columns: Sequence[Column]) -> str:
    listed = ", ".join(c.name for c in columns[:8])
    return listed + (f" and {len(columns) - 8} more" if len(columns) > 8 else "")


Output = tuple[str, str, tuple[int, ...], np.ndarray]  # an output tensor: name, datatype, shape, flat values


def output_tensors(predictions: bytes, request: InferRequest, io: ModelIO) -> list[Output]:
    """The output tensors the request asks for (all when it names none), from the replica's predictions JSON."""
    outputs = _output_tensors(orjson.loads(predictions), request.rows, io)
    if request.outputs is None:
        return outputs
    wanted = dict(request.outputs)
    return [output for output in outputs if output[0] in wanted]


def infer_response(
    predictions: bytes, request: InferRequest, model: str, version: str | None, io: ModelIO
) -> tuple[bytes, int | None]:
    """The REST inference response for the replica's predictions JSON: the body, and the length of its JSON part
    when an output goes as binary data (the ``Inference-Header-Content-Length`` header), else None."""
    return encode_response(output_tensors(predictions, request, io), request, model, version)


def encode_response(
    outputs: Sequence[Output], request: InferRequest, model: str, version: str | None
) -> tuple[bytes, int | None]:
    """Output tensors as the REST inference response (see ``infer_response``)."""
    wanted = dict(request.outputs or ())
    doc: dict[str, Any] = {"model_name": model, "outputs": []}
    if version is not None:
        doc["model_version"] = version
    if request.id is not None:
        doc["id"] = request.id
    binary: list[bytes] = []
    for name, datatype, shape, values in outputs:
        out: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(shape)}
        if request.binary_output or wanted.get(name):
            raw = to_binary(datatype, values)
            out["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        else:
            out["data"] = to_json(datatype, values)
        doc["outputs"].append(out)
    head = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    return (head, None) if not binary else (head + b"".join(binary), len(head))


def _output_tensors(predictions: Any, rows: int, io: ModelIO) -> list[Output]:
    """Predictions as MLflow's scoring server gives them (a list of values, of rows, or of records; or a dict of
    columns) as named tensors; names and datatypes from the model's outputs where it declares them."""
    declared = {c.name: c for c in io.outputs}
    first = io.outputs[0] if io.outputs else None
    if isinstance(predictions, dict):
        columns = {str(k): v if isinstance(v, list) else [v] for k, v in predictions.items()}
    elif isinstance(predictions, list) and predictions and all(isinstance(p, dict) for p in predictions):
        keys = list(dict.fromkeys(k for p in predictions for k in p))
        columns = {str(k): [p.get(k) for p in predictions] for k in keys}
    else:
        values = predictions if isinstance(predictions, list) else [predictions]
        columns = {first.name if first is not None else PREDICTIONS: values}
    tensors: list[Output] = []
    for name, values in columns.items():
        nested = bool(values) and all(isinstance(v, list) for v in values)
        width = len(values[0]) if nested else 1
        if nested and any(len(v) != width for v in values):
            raise ApiError(500, "INTERNAL_ERROR", f"the model's output {name[:64]!r} has rows of different lengths")
        flat = [x for v in values for x in v] if nested else values
        column = declared.get(name) or (first if len(columns) == 1 else None)
        datatype = DATATYPE_OF.get(column.type, "") if column is not None else ""
        datatype = datatype or infer_datatype(flat)
        shape = (len(values), width) if nested else (len(values),)
        tensors.append((name, datatype, shape, output_array(datatype, flat)))
    return tensors


def tensor_metadata(columns: Sequence[Column]) -> list[dict[str, Any]]:
    """Inputs or outputs as the metadata lists them: name, datatype, shape with -1 for the rows."""
    return [
        {"name": c.name, "datatype": DATATYPE_OF.get(c.type, "BYTES"), "shape": [-1] if c.width == 1 else [-1, c.width]}
        for c in columns
    ]


def model_metadata(name: str, versions: Sequence[str], io: ModelIO) -> dict[str, Any]:
    outputs = io.outputs
    return {
        "name": name,
        "versions": list(versions),
        "platform": "mlflow",
        "inputs": tensor_metadata(io.inputs),
        "outputs": tensor_metadata(outputs),
    }


def error_json(err: ApiError) -> bytes:
    """The protocol's error body."""
    return orjson.dumps({"error": err.message})
