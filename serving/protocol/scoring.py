"""MLflow scoring protocol: request bodies -> DataFrame, predictions -> JSON.

Mirrors ``mlflow.pyfunc.scoring_server`` (``dataframe_split``, ``dataframe_records``,
``instances``, ``inputs``, optional ``params``; or CSV) so MLflow clients work
unchanged against the gateway and the replicas. Error messages name keys and
positions only: request payloads may hold PII and must not leak into error
bodies or the logs that record them.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import hashlib
import io
import json
import math
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np
import orjson
import pandas as pd

from serving.protocol.errors import invalid_parameter, malformed_request, payload_too_large, unsupported_media_type

JSON_CONTENT_TYPE = "application/json"
CSV_CONTENT_TYPE = "text/csv"
INPUT_KEYS: tuple[str, ...] = ("dataframe_split", "dataframe_records", "instances", "inputs")
_SPLIT_KEYS = frozenset({"columns", "data", "index"})
_MAX_NAME = 64
_MAX_NAMES_LISTED = 5
_MAX_CONTENT_TYPE = 100


class ScoringRequest:
    """A parsed scoring request; ``input_format`` is the input key used or ``"csv"``.

    The common JSON shapes keep their rows as parsed (``columns`` + ``rows``, or ``by_column``) and build
    the DataFrame only when asked (``frame``): a replica's numpy fast path (``numeric_matrix``) never
    pays for pandas. Either way the frame is the one MLflow's scoring server would build.
    """

    def __init__(
        self,
        *,
        params: dict[str, Any] | None,
        input_format: str,
        frame: pd.DataFrame | None = None,
        columns: list[Any] | None = None,
        rows: list[list[Any]] | None = None,
        by_column: dict[str, list[Any]] | None = None,
        index: list[Any] | None = None,
    ) -> None:
        self.params = params
        self.input_format = input_format
        self._frame = frame
        if frame is not None:
            columns = list(frame.columns)
        elif by_column is not None:
            columns = list(by_column)
        self.columns = columns
        self._rows = rows
        self._by_column = by_column
        self._index = index
        if frame is not None:
            self.n_rows = len(frame)
        elif by_column is not None:
            self.n_rows = len(next(iter(by_column.values())))
        else:
            self.n_rows = len(rows or ())

    @cached_property
    def frame(self) -> pd.DataFrame:
        if self._frame is not None:
            return self._frame
        if self._by_column is not None:
            return _table(lambda: pd.DataFrame(self._by_column), self.input_format)
        return _table(lambda: pd.DataFrame(self._rows, columns=self.columns, index=self._index), self.input_format)

    def numeric_matrix(self, wanted: list[str]) -> np.ndarray | None:
        """The ``wanted`` columns as a float64 (rows x columns) array, if every value in them is a plain
        int or float (no bool, string or null); None otherwise, or if a column is missing (the pandas
        path then gives the precise answer or error)."""
        if self._frame is not None or self._index is not None or self.columns is None:
            return None
        position = {c: i for i, c in enumerate(self.columns)}
        if any(c not in position for c in wanted):
            return None
        if self._by_column is not None:
            matrix = np.array([self._by_column[c] for c in wanted]).T
        else:
            matrix = np.array(self._rows)
            if matrix.ndim != 2:
                return None
            if [position[c] for c in wanted] != list(range(len(self.columns))):
                matrix = matrix[:, [position[c] for c in wanted]]
        if matrix.ndim != 2 or matrix.dtype.kind not in "if":
            return None
        return matrix.astype(np.float64, copy=False)


def joined_frame(requests: list[ScoringRequest]) -> pd.DataFrame:
    """The requests' frames as one, in order: built once from their parsed rows when they all sent rows
    under the same columns (a frame per request and ``pd.concat`` cost more than the predict of a
    batch), else concatenated."""
    first = requests[0]
    if all(
        r._rows is not None and r._frame is None and r._index is None and r.columns == first.columns for r in requests
    ):
        return _table(
            lambda: pd.DataFrame([row for r in requests for row in r._rows or ()], columns=first.columns),
            first.input_format,
        )
    return pd.concat([r.frame for r in requests], ignore_index=True)


def _name(key: object) -> str:
    """Quote a payload key for an error message: escaped and bounded."""
    return json.dumps(str(key)[:_MAX_NAME])


def _names(keys: list[str]) -> str:
    listed = ", ".join(_name(k) for k in keys[:_MAX_NAMES_LISTED])
    extra = len(keys) - _MAX_NAMES_LISTED
    return f"{listed} (and {extra} more)" if extra > 0 else listed


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass  # orjson refuses NaN/Infinity literals and ints past 64 bits, which Python's json (and MLflow) accept
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # JSONDecodeError, bad UTF-8, huge ints
        raise malformed_request("request body is not valid JSON") from None


def _check_row_count(n_rows: int, where: str, max_rows: int) -> None:
    if n_rows == 0:
        raise invalid_parameter(f"{where} contains no rows")
    if n_rows > max_rows:
        raise payload_too_large(f"{where} has more than the maximum of {max_rows} rows")


def _is_label(value: object) -> bool:
    return isinstance(value, (str, int)) and not isinstance(value, bool)


def _parse_split(value: Any, max_rows: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid_parameter("dataframe_split must be an object with 'columns' and 'data'")
    unknown = [k for k in value if k not in _SPLIT_KEYS]
    if unknown:
        raise invalid_parameter(
            f"dataframe_split has unknown key(s) {_names(unknown)}; accepted: 'columns', 'data', 'index'"
        )
    columns, data, index = value.get("columns"), value.get("data"), value.get("index")
    if not isinstance(columns, list) or not columns:
        raise invalid_parameter("dataframe_split.columns must be a non-empty list of strings")
    seen: set[object] = set()
    for i, col in enumerate(columns):
        if not _is_label(col):
            raise invalid_parameter(f"dataframe_split.columns[{i}] must be a string")
        if col in seen:
            raise invalid_parameter(f"dataframe_split.columns[{i}] duplicates an earlier column")
        seen.add(col)
    if not isinstance(data, list):
        raise invalid_parameter("dataframe_split.data must be a list of rows")
    _check_row_count(len(data), "dataframe_split.data", max_rows)
    for i, row in enumerate(data):
        if not isinstance(row, list):
            raise invalid_parameter(f"dataframe_split.data row {i} must be a list")
        if len(row) != len(columns):
            raise invalid_parameter(
                f"dataframe_split.data row {i} has {len(row)} values, expected {len(columns)} columns"
            )
    if index is not None:
        if not isinstance(index, list) or len(index) != len(data):
            raise invalid_parameter(f"dataframe_split.index must be a list with one label per row ({len(data)})")
        for i, label in enumerate(index):
            if not _is_label(label) and not isinstance(label, float):
                raise invalid_parameter(f"dataframe_split.index[{i}] must be a string or number")
    return {"columns": columns, "rows": data, "index": index}


def _parse_rows(value: list[Any], where: str, max_rows: int) -> pd.DataFrame:
    """A list of records (objects), of rows (lists) or of scalars, all of one kind."""
    _check_row_count(len(value), where, max_rows)

    def kind(item: Any) -> str:
        if isinstance(item, dict):
            return "an object"
        return "a list" if isinstance(item, list) else "a scalar"

    first = kind(value[0])
    width = len(value[0]) if first == "a list" else 0
    for i, item in enumerate(value):
        if kind(item) != first:
            raise invalid_parameter(
                f"{where}[{i}] is {kind(item)} but {where}[0] is {first}; all elements must have the same shape"
            )
        if first == "a list" and len(item) != width:
            raise invalid_parameter(f"{where}[{i}] has {len(item)} values, expected {width}")
    if first == "an object":
        return _table(lambda: pd.DataFrame.from_records(value), where)
    # Rows without names: columns 0..n-1, as MLflow does for tensor-style input.
    return _table(lambda: pd.DataFrame(value), where)


def _table(build: Any, where: str) -> pd.DataFrame:
    """pandas' frame of the parsed rows; a 400 when the values cannot make one (an integer past float range)."""
    try:
        return build()
    except (OverflowError, ValueError, TypeError):
        raise invalid_parameter(f"{where} has values that cannot form a table (a number out of range?)") from None


def _parse_records(value: Any, max_rows: int) -> dict[str, Any]:
    if not isinstance(value, list):
        raise invalid_parameter("dataframe_records must be a list of objects")
    _check_row_count(len(value), "dataframe_records", max_rows)
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid_parameter(f"dataframe_records[{i}] must be an object")
    keys = list(value[0])
    if keys and all(list(item) == keys for item in value):  # one shape: rows in the first record's key order
        return {"columns": keys, "rows": [list(item.values()) for item in value]}
    return {"frame": _parse_rows(value, "dataframe_records", max_rows)}


def _parse_instances(value: Any, max_rows: int) -> dict[str, Any]:
    if not isinstance(value, list):
        raise invalid_parameter("instances must be a list")
    return {"frame": _parse_rows(value, "instances", max_rows)}


def _parse_inputs(value: Any, max_rows: int) -> dict[str, Any]:
    if isinstance(value, list):
        return {"frame": _parse_rows(value, "inputs", max_rows)}
    if not isinstance(value, dict):
        raise invalid_parameter("inputs must be an object of column -> list, or a list")
    if not value:
        raise invalid_parameter("inputs has no columns")
    n_rows: int | None = None
    for col, values in value.items():
        if not isinstance(values, list):
            raise invalid_parameter(f"inputs column {_name(col)} must be a list")
        if n_rows is None:
            n_rows = len(values)
            _check_row_count(n_rows, "inputs", max_rows)
        elif len(values) != n_rows:
            raise invalid_parameter(f"inputs column {_name(col)} has {len(values)} values, expected {n_rows}")
    return {"by_column": value}


_PARSERS = {
    "dataframe_split": _parse_split,
    "dataframe_records": _parse_records,
    "instances": _parse_instances,
    "inputs": _parse_inputs,
}


def _parse_json(body: bytes, max_rows: int) -> ScoringRequest:
    doc = _loads(body)
    if not isinstance(doc, dict):
        raise invalid_parameter("request body must be a JSON object")
    unknown = [k for k in doc if k not in _PARSERS and k != "params"]
    if unknown:
        raise invalid_parameter(
            f"unknown top-level key(s) {_names(unknown)}; accepted: {', '.join(INPUT_KEYS)} and optional params"
        )
    present = [k for k in INPUT_KEYS if k in doc]
    if len(present) != 1:
        got = "none" if not present else ", ".join(present)
        raise invalid_parameter(f"request must contain exactly one of {', '.join(INPUT_KEYS)} (got {got})")
    params = doc.get("params")
    if params is not None and not isinstance(params, dict):
        raise invalid_parameter("params must be an object")
    key = present[0]
    parsed = ScoringRequest(params=params, input_format=key, **_PARSERS[key](doc[key], max_rows))
    if not parsed.columns:
        raise invalid_parameter(f"{key} has no columns")
    return parsed


def _parse_csv(body: bytes, max_rows: int) -> ScoringRequest:
    try:
        # nrows bounds the work done for oversized bodies; one extra row detects overflow.
        frame = pd.read_csv(io.BytesIO(body), nrows=max_rows + 1)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        raise malformed_request("request body is not valid CSV") from None
    _check_row_count(len(frame), "CSV input", max_rows)
    return ScoringRequest(frame=frame, params=None, input_format="csv")


def _media_type(content_type: str | None) -> str:
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def parse_scoring_request(body: bytes, content_type: str | None, *, max_rows: int = 10_000) -> ScoringRequest:
    """Parse an invocations body; raises ``ApiError`` (400/413/415) on bad input."""
    media_type = _media_type(content_type)
    if media_type not in (JSON_CONTENT_TYPE, CSV_CONTENT_TYPE):
        shown = json.dumps((content_type or "")[:_MAX_CONTENT_TYPE]) if content_type else "none"
        raise unsupported_media_type(
            f"unsupported content type {shown}; accepted: {JSON_CONTENT_TYPE}, {CSV_CONTENT_TYPE}"
        )
    if not body.strip():
        raise malformed_request("request body is empty")
    if media_type == CSV_CONTENT_TYPE:
        return _parse_csv(body, max_rows)
    return _parse_json(body, max_rows)


def canonical_payload_key(body: bytes) -> str:
    """sha256 of the JSON body re-serialised canonically (sorted keys, no whitespace)."""
    doc = _loads(body)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def _scalar(value: Any) -> Any:
    if isinstance(value, np.datetime64):
        return None if np.isnat(value) else pd.Timestamp(value).isoformat()
    if isinstance(value, np.timedelta64):
        return None if np.isnat(value) else pd.Timedelta(value).isoformat()
    if isinstance(value, np.generic):
        value = value.item()  # numpy scalar -> the matching Python scalar
    if value is None or value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, float):
        # JSON has no NaN/Infinity; Starlette's JSONResponse would refuse them.
        return float(value) if math.isfinite(value) else None
    if isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, dt.timedelta):  # includes pd.Timedelta
        return pd.Timedelta(value).isoformat()
    if isinstance(value, (dt.datetime, dt.date, dt.time)):  # includes pd.Timestamp
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return _scalar(float(value))
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    raise TypeError(f"cannot convert {type(value).__name__} to JSON")


def to_jsonable(predictions: Any) -> Any:
    """Convert model output to plain JSON types; NaN/Inf/NaT/NA become ``None``."""
    if isinstance(predictions, pd.DataFrame):
        return [to_jsonable(r) for r in predictions.to_dict(orient="records")]
    if isinstance(predictions, (pd.Series, pd.Index, np.ndarray)):
        return [to_jsonable(v) for v in predictions.tolist()]
    if isinstance(predictions, Mapping):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in predictions.items()}
    if isinstance(predictions, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in predictions]
    return _scalar(predictions)
