"""The MLflow scoring protocol's JSON bodies, read into a float32 matrix in the model's input order.

One of ``dataframe_split`` (``columns`` and ``data``), ``dataframe_records`` (a list of objects), ``instances`` or
``inputs`` (a list of objects, a list of rows in input order, or an object of columns); ``params`` is allowed and
unused. Columns the model does not read are ignored, as MLflow's schema enforcement does; a missing column or a
value that is not a number is a ``ScoringError`` naming the field, never the value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

FORMATS = ("dataframe_split", "dataframe_records", "instances", "inputs")


class ScoringError(ValueError):
    """The request body cannot be scored; the message names what is wrong."""


def _matrix(rows: list[list[Any]], columns: Sequence[str]) -> np.ndarray:
    try:
        return np.asarray(rows, dtype=np.float32).reshape(len(rows), len(columns))
    except (TypeError, ValueError):
        for i, row in enumerate(rows):
            for column, value in zip(columns, row):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ScoringError(f"row {i}, column {column!r}: not a number") from None
        raise ScoringError("rows do not all have one value per column") from None


def _records(records: Any, field: str, inputs: Sequence[str]) -> np.ndarray:
    if not isinstance(records, list) or not records:
        raise ScoringError(f"{field}: must be a non-empty list")
    if all(isinstance(r, list) for r in records):  # rows already in input order
        if any(len(r) != len(inputs) for r in records):
            raise ScoringError(f"{field}: every row needs {len(inputs)} values, in the order {list(inputs)}")
        return _matrix(records, inputs)
    if not all(isinstance(r, dict) for r in records):
        raise ScoringError(f"{field}: must be a list of objects or a list of rows")
    for i, record in enumerate(records):
        missing = [c for c in inputs if c not in record]
        if missing:
            raise ScoringError(f"{field}[{i}]: missing column(s) {missing}")
    return _matrix([[r[c] for c in inputs] for r in records], inputs)


def _split(split: Any, inputs: Sequence[str]) -> np.ndarray:
    if not isinstance(split, dict) or not isinstance(split.get("columns"), list) or "data" not in split:
        raise ScoringError("dataframe_split: needs 'columns' (a list) and 'data'")
    columns, data = split["columns"], split["data"]
    missing = [c for c in inputs if c not in columns]
    if missing:
        raise ScoringError(f"dataframe_split.columns: missing column(s) {missing}")
    if not isinstance(data, list) or not data or not all(isinstance(r, list) and len(r) == len(columns) for r in data):
        raise ScoringError(f"dataframe_split.data: must be a non-empty list of rows of {len(columns)} values")
    at = [columns.index(c) for c in inputs]
    return _matrix([[row[i] for i in at] for row in data], inputs)


def _columns(table: dict[str, Any], field: str, inputs: Sequence[str]) -> np.ndarray:
    missing = [c for c in inputs if c not in table]
    if missing:
        raise ScoringError(f"{field}: missing column(s) {missing}")
    values = [table[c] if isinstance(table[c], list) else [table[c]] for c in inputs]
    if len({len(v) for v in values}) != 1:
        raise ScoringError(f"{field}: columns have different lengths")
    return _matrix([list(row) for row in zip(*values)], inputs)


def read_rows(body: bytes, inputs: Sequence[str]) -> np.ndarray:
    """The body's rows as float32, one column per model input in order (``ScoringError`` when it cannot be)."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise ScoringError("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise ScoringError(f"the body must be an object with one of {list(FORMATS)}")
    given = [f for f in FORMATS if f in doc]
    unknown = sorted(set(doc) - set(FORMATS) - {"params"})
    if len(given) != 1 or unknown:
        raise ScoringError(f"the body needs exactly one of {list(FORMATS)} (unknown fields: {unknown})")
    (field,) = given
    value = doc[field]
    if field == "dataframe_split":
        return _split(value, inputs)
    if isinstance(value, dict) and field != "dataframe_records":
        return _columns(value, field, inputs)
    return _records(value, field, inputs)
