from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import numpy as np
import pandas as pd
import pytest

from serving.protocol.errors import ApiError
from serving.protocol.scoring import ScoringRequest, canonical_payload_key, parse_scoring_request, to_jsonable

SECRET = "SECRET-VALUE-123"
JSON = "application/json"


def parse(doc: object, content_type: str | None = JSON, **kw: object) -> ScoringRequest:
    return parse_scoring_request(json.dumps(doc).encode(), content_type, **kw)


def error(doc: object | bytes, content_type: str | None = JSON, **kw: object) -> ApiError:
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with pytest.raises(ApiError) as info:
        parse_scoring_request(body, content_type, **kw)
    assert SECRET not in info.value.message
    return info.value


# --- formats ---------------------------------------------------------------


def test_dataframe_split() -> None:
    req = parse({"dataframe_split": {"columns": ["a", "b"], "data": [[1, "x"], [2, "y"]]}})
    assert req.input_format == "dataframe_split"
    assert req.params is None
    expected = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]})
    pd.testing.assert_frame_equal(req.frame, expected)


def test_dataframe_split_with_index() -> None:
    req = parse({"dataframe_split": {"columns": ["a"], "data": [[1.5], [2.5]], "index": ["r1", "r2"]}})
    assert list(req.frame.index) == ["r1", "r2"]
    assert req.frame.loc["r2", "a"] == 2.5


def test_dataframe_records() -> None:
    req = parse({"dataframe_records": [{"a": 1, "b": 2.0}, {"a": 3}]})
    assert req.input_format == "dataframe_records"
    assert list(req.frame.columns) == ["a", "b"]
    assert req.frame["a"].tolist() == [1, 3]
    assert np.isnan(req.frame.loc[1, "b"])


def test_instances_records() -> None:
    req = parse({"instances": [{"x": 1, "y": "u"}, {"x": 2, "y": "v"}]})
    assert req.input_format == "instances"
    pd.testing.assert_frame_equal(req.frame, pd.DataFrame({"x": [1, 2], "y": ["u", "v"]}))


def test_instances_list_of_lists_has_positional_columns() -> None:
    req = parse({"instances": [[1, 2, 3], [4, 5, 6]]})
    assert list(req.frame.columns) == [0, 1, 2]
    assert req.frame.values.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_instances_scalars_make_one_column() -> None:
    req = parse({"instances": [1.0, 2.0, 3.0]})
    assert req.frame.shape == (3, 1)
    assert req.frame[0].tolist() == [1.0, 2.0, 3.0]


def test_inputs_columnar() -> None:
    req = parse({"inputs": {"a": [1, 2, 3], "b": ["x", "y", "z"]}})
    assert req.input_format == "inputs"
    pd.testing.assert_frame_equal(req.frame, pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]}))


def test_inputs_records_and_lists() -> None:
    assert parse({"inputs": [{"a": 1}, {"a": 2}]}).frame["a"].tolist() == [1, 2]
    assert parse({"inputs": [[1, 2, 3, 4]]}).frame.shape == (1, 4)


def test_params_are_returned() -> None:
    req = parse({"inputs": {"a": [1]}, "params": {"temperature": 0.5, "k": [1, 2]}})
    assert req.params == {"temperature": 0.5, "k": [1, 2]}
    assert parse({"inputs": {"a": [1]}, "params": None}).params is None


@pytest.mark.parametrize(
    "content_type",
    ["application/json", "Application/JSON", "application/json; charset=utf-8", " application/json;charset=UTF-8 "],
)
def test_json_content_type_variants(content_type: str) -> None:
    assert parse({"instances": [1]}, content_type).input_format == "instances"


@pytest.mark.parametrize("content_type", ["text/csv", "text/csv; charset=utf-8", "TEXT/CSV"])
def test_csv(content_type: str) -> None:
    req = parse_scoring_request(b"a,b\n1,x\n2,y\n", content_type)
    assert req.input_format == "csv"
    assert req.params is None
    pd.testing.assert_frame_equal(req.frame, pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}))


# --- errors ----------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "", "text/plain", "application/x-www-form-urlencoded"])
def test_unsupported_content_type(content_type: str | None) -> None:
    err = error({"instances": [SECRET]}, content_type)
    assert err.status_code == 415
    assert "application/json" in err.message and "text/csv" in err.message
    if content_type:
        assert content_type in err.message


def test_content_type_is_truncated_in_message() -> None:
    err = error({"instances": [1]}, "x/" + "y" * 500)
    assert err.status_code == 415
    assert "x/" + "y" * 98 in err.message and "y" * 99 not in err.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"instances": ["' + SECRET.encode() + b'"',
        b"not json " + SECRET.encode(),
        b"\xff\xfe" + SECRET.encode(),
        b"[" * 100_000,
    ],
)
def test_invalid_json(body: bytes) -> None:
    err = error(body)
    assert (err.status_code, err.error_code) == (400, "MALFORMED_REQUEST")
    assert err.message == "request body is not valid JSON"


def test_empty_body() -> None:
    assert error(b"  ").status_code == 400
    assert error(b"", "text/csv").status_code == 400


def test_invalid_csv_does_not_echo() -> None:
    err = error(b'a,b\n1,"' + SECRET.encode() + b"\n", "text/csv")
    assert err.status_code == 400
    assert err.message == "request body is not valid CSV"


def test_csv_header_only_is_empty() -> None:
    assert error(b"a,b\n", "text/csv").status_code == 400


def test_csv_row_limit() -> None:
    body = b"a\n" + b"1\n" * 6
    assert parse_scoring_request(body, "text/csv", max_rows=6).frame.shape == (6, 1)
    err = error(body, "text/csv", max_rows=5)
    assert err.status_code == 413 and "5" in err.message


@pytest.mark.parametrize("doc", [[1, 2], "x", 3, None])
def test_body_must_be_object(doc: object) -> None:
    assert error(doc).status_code == 400


def test_unknown_top_level_keys_are_named_and_bounded() -> None:
    doc = {"instances": [1]} | {f"extra{i}": SECRET for i in range(7)} | {"k" * 200: 1}
    err = error(doc)
    assert err.status_code == 400
    assert '"extra0"' in err.message and '"extra4"' in err.message
    assert "extra5" not in err.message
    assert "(and 3 more)" in err.message
    assert "k" * 65 not in err.message


@pytest.mark.parametrize("doc", [{}, {"params": {}}, {"instances": [1], "inputs": [1]}])
def test_exactly_one_input_key(doc: dict) -> None:
    err = error(doc)
    assert err.status_code == 400
    for key in ("dataframe_split", "dataframe_records", "instances", "inputs"):
        assert key in err.message


@pytest.mark.parametrize("params", [[1], SECRET, 3])
def test_params_must_be_object(params: object) -> None:
    err = error({"instances": [1], "params": params})
    assert err.status_code == 400 and "params" in err.message


@pytest.mark.parametrize(
    ("split", "fragment"),
    [
        ([SECRET], "dataframe_split must be an object"),
        ({"data": [[SECRET]]}, "dataframe_split.columns"),
        ({"columns": "a", "data": [[SECRET]]}, "dataframe_split.columns"),
        ({"columns": ["a", 7.5], "data": [[SECRET, 1]]}, "dataframe_split.columns[1]"),
        ({"columns": ["a", "a"], "data": [[SECRET, 1]]}, "columns[1] duplicates"),
        ({"columns": ["a"], "data": SECRET}, "dataframe_split.data must be a list"),
        ({"columns": ["a"], "data": [[1], SECRET]}, "dataframe_split.data row 1 must be a list"),
        (
            {"columns": ["a", "b", "c", "d", "e"], "data": [[1] * 5] * 3 + [[SECRET, 1, 2, 3]]},
            "dataframe_split.data row 3 has 4 values, expected 5 columns",
        ),
        ({"columns": ["a"], "data": [[SECRET]], "index": [1, 2]}, "dataframe_split.index"),
        ({"columns": ["a"], "data": [[SECRET]], "index": [[SECRET]]}, "dataframe_split.index[0]"),
        ({"columns": ["a"], "data": [[SECRET]], SECRET[:3]: 1}, "unknown key"),
    ],
)
def test_dataframe_split_errors(split: object, fragment: str) -> None:
    err = error({"dataframe_split": split})
    assert err.status_code == 400
    assert fragment in err.message


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"dataframe_records": {"a": SECRET}}, "dataframe_records must be a list"),
        ({"dataframe_records": [{"a": 1}, SECRET]}, "dataframe_records[1] must be an object"),
        ({"dataframe_records": [{}]}, "has no columns"),
        ({"instances": {"a": [SECRET]}}, "instances must be a list"),
        ({"instances": [{"a": 1}, [SECRET]]}, "instances[1] is a list"),
        ({"instances": [[1, 2], [SECRET]]}, "instances[1] has 1 values, expected 2"),
        ({"instances": [1, [SECRET]]}, "instances[1]"),
        ({"inputs": SECRET}, "inputs must be"),
        ({"inputs": {}}, "inputs has no columns"),
        ({"inputs": {"a": SECRET}}, 'inputs column "a" must be a list'),
        ({"inputs": {"a": [1, 2], "b": [SECRET]}}, 'inputs column "b" has 1 values, expected 2'),
    ],
)
def test_records_instances_inputs_errors(doc: dict, fragment: str) -> None:
    err = error(doc)
    assert err.status_code == 400
    assert fragment in err.message


@pytest.mark.parametrize(
    "doc",
    [
        {"dataframe_split": {"columns": ["a"], "data": []}},
        {"dataframe_records": []},
        {"instances": []},
        {"inputs": []},
        {"inputs": {"a": []}},
    ],
)
def test_empty_input_is_400(doc: dict) -> None:
    err = error(doc)
    assert err.status_code == 400 and "no rows" in err.message


@pytest.mark.parametrize(
    "make",
    [
        lambda n: {"dataframe_split": {"columns": ["a"], "data": [[1]] * n}},
        lambda n: {"dataframe_records": [{"a": 1}] * n},
        lambda n: {"instances": [1] * n},
        lambda n: {"inputs": {"a": [1] * n}},
    ],
)
def test_row_limit(make) -> None:
    assert len(parse(make(10), max_rows=10).frame) == 10
    err = error(make(11), max_rows=10)
    assert err.status_code == 413
    assert "10" in err.message


# --- canonical key -----------------------------------------------------------


def test_canonical_key_ignores_key_order_and_whitespace() -> None:
    a = b'{"inputs": {"a": [1, 2], "b": ["x"]}, "params": {"k": 1, "j": 2}}'
    b = b'{"params":{"j":2,"k":1},\n  "inputs":{"b":["x"],"a":[1,2]}}'
    assert canonical_payload_key(a) == canonical_payload_key(b)
    assert len(canonical_payload_key(a)) == 64
    other = b'{"inputs": {"a": [2, 1], "b": ["x"]}}'
    assert canonical_payload_key(a) != canonical_payload_key(other)


def test_canonical_key_invalid_json() -> None:
    with pytest.raises(ApiError) as info:
        canonical_payload_key(b'{"a": "' + SECRET.encode())
    assert info.value.status_code == 400
    assert info.value.message == "request body is not valid JSON"


# --- predictions -----------------------------------------------------------


def test_to_jsonable_numpy_and_nan() -> None:
    out = to_jsonable(np.array([1.0, np.nan, np.inf]))
    assert out == [1.0, None, None]
    assert to_jsonable(np.int64(3)) == 3 and type(to_jsonable(np.int64(3))) is int
    assert type(to_jsonable(np.float32(0.5))) is float
    assert to_jsonable(np.bool_(True)) is True
    assert to_jsonable(np.array([[1, 2], [3, 4]], dtype=np.int32)) == [[1, 2], [3, 4]]
    assert to_jsonable(float("nan")) is None
    assert to_jsonable([np.float64("nan"), pd.NA, pd.NaT, None]) == [None, None, None, None]


def test_to_jsonable_pandas() -> None:
    df = pd.DataFrame({"p": [0.1, np.nan], "label": ["a", "b"], "n": np.array([1, 2], dtype="int64")})
    assert to_jsonable(df) == [{"p": 0.1, "label": "a", "n": 1}, {"p": None, "label": "b", "n": 2}]
    assert to_jsonable(pd.Series([1.5, np.nan])) == [1.5, None]
    ts = pd.Series(pd.to_datetime(["2024-01-02", None]))
    assert to_jsonable(ts) == ["2024-01-02T00:00:00", None]


def test_to_jsonable_misc_types_and_json_roundtrip() -> None:
    value = {
        np.int64(1): (np.float64(2.5), Decimal("1.5")),
        "when": dt.date(2024, 1, 2),
        "raw": b"\x00\x01",
        "nested": {"x": np.array([np.nan])},
    }
    out = to_jsonable(value)
    assert out == {"1": [2.5, 1.5], "when": "2024-01-02", "raw": "AAE=", "nested": {"x": [None]}}
    json.dumps(out, allow_nan=False)
    with pytest.raises(TypeError):
        to_jsonable(object())


def test_a_numpy_array_becomes_a_json_list() -> None:
    body = {"predictions": to_jsonable(np.array([0, 1]))}
    assert body == {"predictions": [0, 1]}
    json.dumps(body, allow_nan=False)


def test_joined_frame_is_the_requests_frames_in_order_however_they_were_sent():
    from serving.protocol.scoring import joined_frame

    def parse(doc: object):  # type: ignore[no-untyped-def]
        return parse_scoring_request(json.dumps(doc).encode(), "application/json")

    split = [
        parse({"dataframe_split": {"columns": ["a", "b"], "data": rows}})
        for rows in ([[1, "x"]], [[2.5, "y"], [3, "z"]])
    ]
    expected = pd.concat([r.frame for r in split], ignore_index=True)
    pd.testing.assert_frame_equal(joined_frame(split), expected)
    records = parse({"dataframe_records": [{"b": "w", "a": 4.0}]})  # other shapes: the frames concatenated
    pd.testing.assert_frame_equal(
        joined_frame([*split, records]), pd.concat([expected, records.frame], ignore_index=True)
    )
