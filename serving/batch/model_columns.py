"""The columns a model reads when the input carries them itself: the inputs of its MLflow signature.

A model version registered without a FeatureService is scored from the input's own columns (no
feature store is involved). Which columns, and of which type, comes from the model's signature; the
type rules below are the conversions MLflow's pyfunc schema enforcement accepts
(``mlflow.models.utils._enforce_mlflow_datatype``), so an input that passes the check before the run
does not fail in ``predict`` midway. Pure: no MLflow import beyond reading a schema object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

NULLABLE_KINDS = ("float", "double")  # NaN is a value of these columns; a null integer would arrive as a float


@dataclass(frozen=True)
class ModelColumn:
    name: str
    kind: str  # the MLflow DataType name: boolean, integer, long, float, double, string, binary, datetime
    required: bool = True

    @property
    def nullable(self) -> bool:
        """Nulls pass the input check only where the signature marks the column optional and NaN can carry them."""
        return not self.required and self.kind in NULLABLE_KINDS


def from_signature(schema: Any, model: str) -> tuple[ModelColumn, ...]:
    """The named, flat input columns of an MLflow input schema (``signature.inputs``); ``model`` names it in errors."""
    if schema is None:
        raise ValueError(
            f"{model} has neither a feature service nor a signature: batch scoring cannot tell "
            "which input columns the model reads (log it with a signature, or with a feature service)"
        )
    if schema.is_tensor_spec() or not schema.has_input_names():
        raise ValueError(
            f"{model} has no feature service and its signature is not one of named columns: "
            "batch scoring without a feature service reads named parquet columns"
        )
    columns = []
    for spec in schema.inputs:
        kind = getattr(spec.type, "name", None)
        if kind not in ACCEPTED:
            raise ValueError(
                f"{model}: signature input {spec.name} has type {spec.type}; batch scoring reads flat "
                f"columns of type {', '.join(ACCEPTED)}"
            )
        columns.append(ModelColumn(spec.name, kind, bool(getattr(spec, "required", True))))
    if not columns:
        raise ValueError(f"{model} has no feature service and its signature names no input column")
    return tuple(columns)


def _integer(bits: int, unsigned_bits: int):
    def accepts(t: pa.DataType) -> bool:
        return (pa.types.is_signed_integer(t) and t.bit_width <= bits) or (
            pa.types.is_unsigned_integer(t) and t.bit_width <= unsigned_bits
        )

    return accepts


ACCEPTED: dict[str, tuple[str, Any]] = {
    # signature type: (what the parquet column must be, the test)
    "boolean": ("a boolean", pa.types.is_boolean),
    "integer": ("an integer of at most 32 bits", _integer(32, 16)),
    "long": ("an integer of at most 64 bits (unsigned: 32)", _integer(64, 32)),
    "float": ("a float of at most 32 bits", lambda t: pa.types.is_floating(t) and t.bit_width <= 32),
    "double": (
        "a float, or an integer of at most 32 bits",
        lambda t: pa.types.is_floating(t) or (pa.types.is_integer(t) and t.bit_width <= 32),
    ),
    "string": ("a string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
    "binary": ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)),
    "datetime": ("a timestamp without time zone", lambda t: pa.types.is_timestamp(t) and t.tz is None),
}


def type_problem(column: ModelColumn, arrow_type: pa.DataType) -> str | None:
    """Why a parquet column of ``arrow_type`` cannot feed ``column`` (None when it can); never quotes a value."""
    wanted, accepts = ACCEPTED[column.kind]
    if accepts(arrow_type):
        return None
    return f"model input column {column.name} must be {wanted} (signature type {column.kind}), got {arrow_type}"
