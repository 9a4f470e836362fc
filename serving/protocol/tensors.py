"""Tensors of the Open Inference Protocol: its datatypes, JSON data (nested or flat, row-major) and the binary
tensor data extension (fixed-size elements little-endian; BYTES elements each after a 4-byte little-endian
length), to and from flat numpy arrays. Errors name the tensor, never a value."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from serving.protocol.errors import ApiError, invalid_parameter

# Every datatype of the spec that a model's columns can map to, with its numpy type (BYTES: Python bytes/str)
DATATYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": None,
}
INTEGERS = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
FLOATS = frozenset({"FP16", "FP32", "FP64"})
MAX_ELEMENTS = 10_000_000


@dataclass(frozen=True)
class Tensor:
    """A named tensor: ``values`` flat, row-major (an object array of bytes or str for BYTES)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    values: np.ndarray

    @property
    def rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def width(self) -> int:
        """Values per row: the product of the dimensions after the first."""
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1


def check_header(where: str, name: Any, datatype: Any, shape: Any) -> tuple[str, str, tuple[int, ...]]:
    """A tensor's name, datatype and shape, checked."""
    if not isinstance(name, str) or not name:
        raise invalid_parameter(f"{where}: name must be a non-empty string")
    label = f"{where} {name[:64]!r}"
    if datatype not in DATATYPES:
        raise invalid_parameter(f"{label}: datatype must be one of {', '.join(DATATYPES)}")
    if (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise invalid_parameter(f"{label}: shape must be a non-empty list of non-negative integers")
    if math.prod(shape) > MAX_ELEMENTS:
        raise invalid_parameter(f"{label}: shape holds more than {MAX_ELEMENTS} elements")
    return name, datatype, tuple(shape)


def from_json(label: str, datatype: str, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """``data`` (nested or flat lists, row-major) as a flat array of ``datatype``, its size checked against
    ``shape``."""
    if not isinstance(data, list):
        data = [data]
    try:
        array = np.asarray(data, dtype=object if datatype == "BYTES" else None).reshape(-1)
    except ValueError:
        raise invalid_parameter(f"{label}: data is ragged (nested lists of different lengths)") from None
    if array.size != math.prod(shape):
        raise invalid_parameter(
            f"{label}: data holds {array.size} elements but shape {list(shape)} needs {math.prod(shape)}"
        )
    if datatype == "BYTES":
        if not all(isinstance(v, (str, bytes)) for v in array):  # bytes: from a gRPC request
            raise invalid_parameter(f"{label}: BYTES data must be strings")
        return array
    kind = array.dtype.kind if array.size else ("b" if datatype == "BOOL" else "i")
    allowed = "b" if datatype == "BOOL" else "iu" if datatype in INTEGERS else "iuf"
    if kind not in allowed:
        raise invalid_parameter(f"{label}: data does not hold {datatype} values")
    try:
        with np.errstate(over="raise"):
            out = array.astype(DATATYPES[datatype])
    except (OverflowError, FloatingPointError):
        raise invalid_parameter(f"{label}: a value is out of the range of {datatype}") from None
    if kind in "iu" and datatype in INTEGERS and not np.array_equal(out.astype(array.dtype), array):
        raise invalid_parameter(f"{label}: a value is out of the range of {datatype}")
    return out


def from_binary(label: str, datatype: str, shape: tuple[int, ...], raw: bytes) -> np.ndarray:
    """A tensor's bytes of the binary data extension as a flat array, their size checked against ``shape``."""
    count = math.prod(shape)
    if datatype == "BYTES":
        values, at = [], 0
        while at < len(raw):
            if at + 4 > len(raw):
                raise invalid_parameter(f"{label}: binary BYTES data ends inside an element's length")
            (size,) = struct.unpack_from("<I", raw, at)
            at += 4
            if at + size > len(raw):
                raise invalid_parameter(f"{label}: binary BYTES data ends inside an element")
            values.append(raw[at : at + size])
            at += size
        if len(values) != count:
            raise invalid_parameter(
                f"{label}: binary data holds {len(values)} elements but shape {list(shape)} needs {count}"
            )
        return np.array(values, dtype=object)
    dtype = np.dtype(DATATYPES[datatype]).newbyteorder("<")
    if len(raw) != count * dtype.itemsize:
        raise invalid_parameter(
            f"{label}: binary data holds {len(raw)} bytes but shape {list(shape)} of {datatype} needs "
            f"{count * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).astype(DATATYPES[datatype])


def to_binary(datatype: str, values: np.ndarray) -> bytes:
    """A flat array as the binary data extension's bytes."""
    if datatype == "BYTES":
        parts = []
        for v in values:
            raw = v if isinstance(v, bytes) else str(v).encode()
            parts.append(struct.pack("<I", len(raw)) + raw)
        return b"".join(parts)
    return np.ascontiguousarray(values, dtype=np.dtype(DATATYPES[datatype]).newbyteorder("<")).tobytes()


def to_json(datatype: str, values: np.ndarray) -> list[Any]:
    """A flat array as the JSON data of a tensor (BYTES as strings)."""
    if datatype == "BYTES":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in values]
    return values.tolist()


def infer_datatype(values: Sequence[Any]) -> str:
    """The datatype of predictions as JSON gave them: BOOL, INT64, FP64, else BYTES."""
    if values and all(isinstance(v, bool) for v in values):
        return "BOOL"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "INT64"
    if all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in values):
        return "FP64"
    return "BYTES"


def output_array(datatype: str, values: Sequence[Any]) -> np.ndarray:
    """Predictions (JSON values) as a flat array of ``datatype`` (null as NaN in a float output)."""
    if datatype == "BYTES":
        return np.array([v if isinstance(v, str) else _text(v) for v in values], dtype=object)
    if datatype in FLOATS:
        return np.array([math.nan if v is None else v for v in values], dtype=DATATYPES[datatype])
    try:
        return np.array(values, dtype=DATATYPES[datatype])
    except (TypeError, ValueError, OverflowError):
        raise ApiError(500, "INTERNAL_ERROR", f"the model's predictions are not {datatype} values") from None


def _text(value: Any) -> str:
    import orjson

    return orjson.dumps(value).decode()
