"""Stream events as scoring requests: one Redis Streams entry, one row.

A stream event is a flat map of field name -> string (Redis stream fields are strings). The gateway
forwards it with content type ``application/x-tollfree-event+json`` and a JSON object body; the replica
parses each string by the type of the model input it feeds (MLflow signature type names, or the
entity keys and request fields of the model's FeatureService). Fields the model does not take are
ignored: events carry metadata. Error messages name the field and the type it must have, never its
value: events may carry PII.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pandas as pd

from serving.protocol.errors import invalid_parameter, malformed_request
from serving.protocol.scoring import ScoringRequest

EVENT_CONTENT_TYPE = "application/x-tollfree-event+json"
EVENT_KINDS: tuple[str, ...] = ("double", "float", "long", "integer", "boolean", "string", "datetime")

_MAX_NAME = 64
_MAX_NAMES_LISTED = 5
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_BOOLEANS = {"true": True, "1": True, "false": False, "0": False}
# Kinds whose pandas dtype is not the one Python values give (int64, float64): the frame is built typed.
_TYPED = {"float": "float32", "integer": "int32"}


def is_event_content_type(content_type: str | None) -> bool:
    """Whether a Content-Type header (parameters and case aside) says the body is a stream event."""
    if not content_type:
        return False
    return content_type.split(";", 1)[0].strip().lower() == EVENT_CONTENT_TYPE


def _quoted(name: object) -> str:
    return json.dumps(str(name)[:_MAX_NAME])


def _number(text: str, bound: float) -> float | None:
    if not _DECIMAL.fullmatch(text.strip()):
        return None
    number = float(text)
    return number if math.isfinite(number) and abs(number) <= bound else None


def _whole(text: str, bits: int) -> int | None:
    if not _INTEGER.fullmatch(text.strip()):
        return None
    number = int(text)
    return number if -(2 ** (bits - 1)) <= number < 2 ** (bits - 1) else None


def _timestamp(text: str) -> pd.Timestamp | None:
    """ISO 8601; an offset is converted to UTC and dropped (MLflow's datetime columns are naive)."""
    try:
        moment = dt.datetime.fromisoformat(text.strip())
        if moment.tzinfo is not None:
            moment = moment.astimezone(dt.UTC).replace(tzinfo=None)
        return pd.Timestamp(moment).as_unit("ns")
    except (ValueError, OverflowError):  # not ISO 8601, or outside pandas' nanosecond range
        return None


# kind -> (parse a string, or None if it is not one; what the field must be, for the error message)
_CONVERTERS: dict[str, tuple[Callable[[str], Any], str]] = {
    "double": (lambda s: _number(s, math.inf), "a double (a finite number)"),
    "float": (lambda s: _number(s, _FLOAT32_MAX), "a float (a finite number within float32 range)"),
    "long": (lambda s: _whole(s, 64), "a long (an integer)"),
    "integer": (lambda s: _whole(s, 32), "an integer (a 32-bit integer)"),
    "boolean": (lambda s: _BOOLEANS.get(s.strip().lower()), "a boolean (true, false, 1 or 0)"),
    "string": (lambda s: s, "a string"),
    "datetime": (_timestamp, "a datetime (ISO 8601)"),
}


def _event(body: bytes) -> dict[str, str]:
    """The body as a JSON object of strings; a 400 naming the field otherwise."""
    if not body.strip():
        raise malformed_request("request body is empty")
    try:
        event = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise malformed_request("request body is not valid JSON") from None
    if not isinstance(event, dict):
        raise invalid_parameter("an event must be a JSON object of field name -> string value")
    for name, value in event.items():
        if not isinstance(value, str):
            raise invalid_parameter(f"event field {_quoted(name)} must be a string (stream event fields are strings)")
    return event


def _missing(names: list[str]) -> str:
    if len(names) == 1:
        return f"event is missing field {_quoted(names[0])}"
    listed = ", ".join(_quoted(n) for n in names[:_MAX_NAMES_LISTED])
    extra = len(names) - _MAX_NAMES_LISTED
    return f"event is missing fields {listed}" + (f" (and {extra} more)" if extra > 0 else "")


def parse_event(body: bytes, fields: dict[str, str] | None) -> ScoringRequest:
    """One stream event as a one-row scoring request.

    ``fields``: the model's input columns in order, each with its kind (``EVENT_KINDS``); the request has
    exactly those columns, each string parsed to its kind. None (a model without named inputs): every
    event field, in the event's order, as a string column. Raises ``ApiError`` (400) on a body that is
    not an object of strings, a missing field, or a value that is not of its field's kind.
    """
    event = _event(body)
    if fields is None:
        if not event:
            raise invalid_parameter("event has no fields")
        return ScoringRequest(params=None, input_format="event", columns=list(event), rows=[list(event.values())])
    missing = [name for name in fields if name not in event]
    if missing:
        raise invalid_parameter(_missing(missing))
    row = []
    for name, kind in fields.items():
        converter = _CONVERTERS.get(kind)
        if converter is None:
            raise invalid_parameter(
                f"model input {_quoted(name)} has type {_quoted(kind)}, which a stream event cannot carry"
            )
        value = converter[0](event[name])
        if value is None:
            raise invalid_parameter(f"event field {_quoted(name)} must be {converter[1]}")
        row.append(value)
    columns = list(fields)
    typed = {name: _TYPED[kind] for name, kind in fields.items() if kind in _TYPED}
    if typed:  # MLflow refuses float64 for a float column and int64 for an integer one: give it theirs
        frame = pd.DataFrame([row], columns=columns).astype(typed)
        return ScoringRequest(params=None, input_format="event", frame=frame)
    return ScoringRequest(params=None, input_format="event", columns=columns, rows=[row])
