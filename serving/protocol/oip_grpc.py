"""The Open Inference Protocol's gRPC messages (``serving.protocol.v2``, compiled from the specification's proto) to
and from the protocol's tensors, so a gRPC request takes the REST request's path (``serving.protocol.oip``).

An input's data comes either typed (``InferTensorContents``: the field of its datatype) or raw
(``raw_input_contents``: one entry per input, in the binary data extension's layout); FP16 comes only raw, as the
specification says. Outputs always go raw (``raw_output_contents``), as Triton answers: every client of the protocol
reads them. Pure: messages in, messages out; errors are ApiError 400 naming the input, never a value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from serving.protocol.errors import invalid_parameter
from serving.protocol.oip import InferRequest, Output, infer_request
from serving.protocol.tensors import Tensor, check_header, from_binary, from_json, to_binary
from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

# the InferTensorContents field that carries each datatype's typed data (FP16 has none: raw only)
CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def request_from_message(message: pb.ModelInferRequest) -> InferRequest:
    """A ``ModelInferRequest`` as the protocol's request: its tensors checked against their shapes."""
    raw = message.raw_input_contents
    if raw and len(raw) != len(message.inputs):
        raise invalid_parameter(
            f"raw_input_contents holds {len(raw)} entries for {len(message.inputs)} inputs (one per input)"
        )
    inputs = []
    for i, item in enumerate(message.inputs):
        name, datatype, shape = check_header(f"input {i}", item.name, item.datatype, list(item.shape))
        label = f"input {name[:64]!r}"
        if raw:
            if item.HasField("contents"):
                raise invalid_parameter(f"{label}: contents and raw_input_contents cannot both carry data")
            values = from_binary(label, datatype, shape, raw[i])
        else:
            field = CONTENTS.get(datatype)
            if field is None:
                raise invalid_parameter(f"{label}: {datatype} data must come in raw_input_contents")
            values = from_json(label, datatype, shape, list(getattr(item.contents, field)))
        inputs.append(Tensor(name, datatype, shape, values))
    outputs = tuple((o.name, True) for o in message.outputs) or None
    return infer_request(message.id or None, inputs, outputs, binary_output=True)


def infer_response(
    outputs: Sequence[Output], request: InferRequest, model: str, version: str | None
) -> pb.ModelInferResponse:
    """Output tensors as a ``ModelInferResponse``, their data raw."""
    response = pb.ModelInferResponse(model_name=model, model_version=version or "", id=request.id or "")
    for name, datatype, shape, values in outputs:
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        response.raw_output_contents.append(to_binary(datatype, values))
    return response


def model_metadata(doc: dict[str, Any]) -> pb.ModelMetadataResponse:
    """The REST metadata document (``serving.protocol.oip.model_metadata``) as its message."""
    tensor = pb.ModelMetadataResponse.TensorMetadata
    return pb.ModelMetadataResponse(
        name=doc["name"],
        versions=doc["versions"],
        platform=doc["platform"],
        inputs=[tensor(**t) for t in doc["inputs"]],
        outputs=[tensor(**t) for t in doc["outputs"]],
    )
