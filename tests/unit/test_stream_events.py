"""Stream events as scoring requests: each string parsed by its model input's type, errors naming the
field and never its value, and the result usable by the replica's numpy and pandas paths."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd
import pytest

from serving.protocol.errors import ApiError
from serving.protocol.events import EVENT_CONTENT_TYPE, is_event_content_type, parse_event
from serving.protocol.scoring import joined_frame

FIELDS = {
    "amount": "double",
    "ratio": "float",
    "customer_id": "long",
    "count": "integer",
    "flag": "boolean",
    "name": "string",
    "at": "datetime",
}
EVENT = {
    "amount": "12.5",
    "ratio": "0.25",
    "customer_id": "9007199254740993",
    "count": "-3",
    "flag": "TRUE",
    "name": "Ann Lee",
    "at": "2024-03-01T10:15:00+02:00",
}


def event(**fields: object) -> bytes:
    return orjson.dumps(fields)


def refused(body: bytes, fields: dict[str, str] | None) -> ApiError:
    with pytest.raises(ApiError) as err:
        parse_event(body, fields)
    assert err.value.status_code == 400
    return err.value


def test_every_kind_is_parsed_to_its_python_value_and_pandas_dtype() -> None:
    request = parse_event(event(**EVENT, source="orders-stream", seq="17"), FIELDS)
    assert request.input_format == "event" and request.params is None and request.n_rows == 1
    assert request.columns == list(FIELDS)  # the model's columns in its order; the metadata fields dropped
    row = request.frame.iloc[0]
    assert row["amount"] == 12.5 and row["ratio"] == 0.25 and row["customer_id"] == 9007199254740993
    assert row["count"] == -3 and row["flag"] is np.True_ and row["name"] == "Ann Lee"
    assert row["at"] == pd.Timestamp("2024-03-01T08:15:00")  # the offset converted to UTC, then dropped
    assert [str(t) for t in request.frame.dtypes] == [
        "float64",
        "float32",
        "int64",
        "int32",
        "bool",
        "object",
        "datetime64[ns]",
    ]


@pytest.mark.parametrize(
    ("kind", "text", "value"),
    [
        ("double", "3", 3.0),
        ("double", " -1.5e3 ", -1500.0),
        ("double", ".5", 0.5),
        ("float", "1e10", 1e10),
        ("long", "12", 12),
        ("long", "+7", 7),
        ("long", "-9223372036854775808", -(2**63)),
        ("integer", "2147483647", 2**31 - 1),
        ("boolean", "true", True),
        ("boolean", "False", False),
        ("boolean", "1", True),
        ("boolean", "0", False),
        ("string", "", ""),
        ("string", " 12 ", " 12 "),
        ("datetime", "2024-03-01", pd.Timestamp("2024-03-01")),
        ("datetime", "2024-03-01T10:15:00.5Z", pd.Timestamp("2024-03-01T10:15:00.5")),
    ],
)
def test_accepted_strings(kind: str, text: str, value: object) -> None:
    got = parse_event(event(x=text), {"x": kind}).frame.iloc[0, 0]
    assert (got == value and type(got) is not str) or kind == "string"


@pytest.mark.parametrize(
    ("kind", "text", "must_be"),
    [
        ("double", "abc", "a double (a finite number)"),
        ("double", "nan", "a double (a finite number)"),
        ("double", "inf", "a double (a finite number)"),
        ("double", "1e999", "a double (a finite number)"),
        ("double", "", "a double (a finite number)"),
        ("double", "1_000", "a double (a finite number)"),
        ("float", "3e39", "a float (a finite number within float32 range)"),
        ("float", "-Infinity", "a float (a finite number within float32 range)"),
        ("long", "1.5", "a long (an integer)"),
        ("long", "abc", "a long (an integer)"),
        ("long", "1e3", "a long (an integer)"),
        ("long", "9223372036854775808", "a long (an integer)"),
        ("long", "\u0661\u0662", "a long (an integer)"),
        ("integer", "2147483648", "an integer (a 32-bit integer)"),
        ("integer", "7.0", "an integer (a 32-bit integer)"),
        ("boolean", "yes", "a boolean (true, false, 1 or 0)"),
        ("boolean", "2", "a boolean (true, false, 1 or 0)"),
        ("datetime", "now", "a datetime (ISO 8601)"),
        ("datetime", "03/01/2024", "a datetime (ISO 8601)"),
        ("datetime", "3000-01-01", "a datetime (ISO 8601)"),  # past pandas' nanosecond range
    ],
)
def test_a_value_not_of_its_kind_is_refused_naming_the_field_and_never_the_value(
    kind: str, text: str, must_be: str
) -> None:
    err = refused(event(secret_field=text, other="x"), {"secret_field": kind})
    assert err.error_code == "INVALID_PARAMETER_VALUE"
    assert err.message == f'event field "secret_field" must be {must_be}'
    if text.strip():
        assert text not in err.message


def test_a_missing_field_is_named() -> None:
    err = refused(event(amount="1.0"), {"amount": "double", "customer_id": "long"})
    assert err.error_code == "INVALID_PARAMETER_VALUE" and err.message == 'event is missing field "customer_id"'
    many = refused(event(), {f"f{i}": "double" for i in range(7)})
    assert many.message == 'event is missing fields "f0", "f1", "f2", "f3", "f4" (and 2 more)'


def test_the_body_must_be_a_json_object_of_strings() -> None:
    for body in (b"", b"  ", b"{not json", b'{"a": NaN}'):
        assert refused(body, FIELDS).error_code == "MALFORMED_REQUEST"
    for body in (b"[]", b'"a"', b"3", b"null"):
        err = refused(body, FIELDS)
        assert err.error_code == "INVALID_PARAMETER_VALUE"
        assert err.message == "an event must be a JSON object of field name -> string value"
    for value in (12.5, 7, True, None, ["12"], {"v": "1"}):
        err = refused(event(amount=value), {"amount": "double"})
        assert err.message == 'event field "amount" must be a string (stream event fields are strings)'
        # a metadata field the model ignores is still part of the event: a number there is refused too
        extra = refused(event(amount="1.0", meta=value), {"amount": "double"})
        assert extra.message == 'event field "meta" must be a string (stream event fields are strings)'


def test_a_model_input_type_no_event_can_carry_is_refused() -> None:
    err = refused(event(blob="abc"), {"blob": "binary"})
    assert err.message == 'model input "blob" has type "binary", which a stream event cannot carry'


def test_without_named_inputs_every_field_is_a_string_column_in_the_events_order() -> None:
    request = parse_event(event(b="2", a="x", c="3.5"), None)
    assert request.columns == ["b", "a", "c"]
    assert request.frame.iloc[0].tolist() == ["2", "x", "3.5"] and (request.frame.dtypes == "object").all()
    assert request.numeric_matrix(["b", "c"]) is None  # strings: the pandas path decides
    assert refused(b"{}", None).message == "event has no fields"


def test_long_field_names_are_bounded_in_messages() -> None:
    name = "n" * 500
    err = refused(event(**{name: 1}), None)
    assert len(err.message) < 200


def test_double_events_take_the_numpy_path_and_join_as_one_frame() -> None:
    fields = {"f0": "double", "f1": "double"}
    events = [parse_event(event(f1=str(i), f0=str(i / 2), id=f"e{i}"), fields) for i in range(3)]
    matrix = events[1].numeric_matrix(["f0", "f1"])
    assert matrix is not None and matrix.dtype == np.float64 and matrix.tolist() == [[0.5, 1.0]]
    assert events[0].numeric_matrix(["f1", "f0"]).tolist() == [[0.0, 0.0]]
    joined = joined_frame(events)
    assert joined["f0"].tolist() == [0.0, 0.5, 1.0] and [str(t) for t in joined.dtypes] == ["float64", "float64"]


def test_events_of_every_kind_join_keeping_their_dtypes() -> None:
    events = [parse_event(event(**EVENT), FIELDS), parse_event(event(**{**EVENT, "count": "4", "flag": "0"}), FIELDS)]
    joined = joined_frame(events)
    assert len(joined) == 2 and joined["count"].tolist() == [-3, 4] and joined["flag"].tolist() == [True, False]
    assert [str(t) for t in joined.dtypes] == [str(t) for t in events[0].frame.dtypes]
    longs = [
        parse_event(event(customer_id=str(i), amount="1"), {"customer_id": "long", "amount": "double"})
        for i in range(2)
    ]
    frame = joined_frame(longs)
    assert [str(t) for t in frame.dtypes] == ["int64", "float64"] and frame["customer_id"].tolist() == [0, 1]
    assert not any(math.isnan(v) for v in frame["amount"])


def test_the_content_type_is_recognised_with_parameters_and_any_case() -> None:
    assert is_event_content_type(EVENT_CONTENT_TYPE)
    assert is_event_content_type(" Application/X-Tollfree-Event+JSON ; charset=utf-8")
    for other in (None, "", "application/json", "application/x-tollfree-event", "text/csv"):
        assert not is_event_content_type(other)
