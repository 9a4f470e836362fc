"""Hypothesis on the scoring-payload parser: whatever arrives, it answers with an ``ApiError`` (400, 413
or 415) or a parsed request whose frame builds, and its messages never carry a value from the payload.

Keys and positions may be named (that is the point of the messages; keys are cut to 64 characters);
values never. So the generated documents draw their keys from a small fixed vocabulary and their
string values from marker strings that no message could contain by accident.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.protocol.errors import ApiError
from serving.protocol.scoring import INPUT_KEYS, parse_scoring_request

MARK = "VAL\u00a7"  # every string value starts with it; no message text contains it
KEYS = [*INPUT_KEYS, "params", "columns", "data", "index", "customer_id", "merchant_id", "amount", "x", ""]
CONTENT_TYPES = [
    "application/json",
    "application/json; charset=utf-8",
    "text/csv",
    "TEXT/CSV",
    None,
    "",
    "application/x-www-form-urlencoded",
    "text/plain",
]
SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12).map(lambda s: MARK + s),
)
documents = st.recursive(
    values,
    lambda children: st.one_of(
        st.lists(children, max_size=5), st.dictionaries(st.sampled_from(KEYS), children, max_size=5)
    ),
    max_leaves=40,
)
# Shapes close to valid ones, so the parser gets past its first checks and into the per-format paths.
rows = st.lists(st.lists(values, min_size=1, max_size=4), min_size=1, max_size=6)
near_valid = st.one_of(
    st.builds(
        lambda cols, data, index: {"dataframe_split": {"columns": cols, "data": data, **index}},
        st.lists(st.one_of(st.sampled_from(KEYS), st.integers(), values), max_size=4),
        st.one_of(rows, documents),
        st.one_of(st.just({}), st.builds(lambda i: {"index": i}, st.lists(values, max_size=6))),
    ),
    st.builds(
        lambda recs: {"dataframe_records": recs},
        st.lists(
            st.one_of(st.dictionaries(st.sampled_from(KEYS), values, max_size=4), documents), min_size=0, max_size=6
        ),
    ),
    st.builds(lambda v: {"instances": v}, st.one_of(rows, st.lists(values, max_size=6), documents)),
    st.builds(
        lambda v: {"inputs": v},
        st.one_of(rows, st.dictionaries(st.sampled_from(KEYS), st.lists(values, max_size=4), max_size=4), documents),
    ),
    st.builds(
        lambda d, p: {**d, "params": p}, st.dictionaries(st.sampled_from(INPUT_KEYS), documents, max_size=2), documents
    ),
)


def _check(body: bytes, content_type: str | None, max_rows: int = 5) -> None:
    try:
        parsed = parse_scoring_request(body, content_type, max_rows=max_rows)
    except ApiError as err:
        assert err.status_code in (400, 413, 415), err
        assert set(err.headers) <= {"Retry-After"}
        return_message = err.message
        assert MARK not in return_message, return_message
        assert len(return_message) < 600
        return
    assert 1 <= parsed.n_rows <= max_rows
    frame = parsed.frame  # the lazily built frame must build for anything that parsed
    assert len(frame) == parsed.n_rows


def _strings(doc: object) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, list):
        return [s for item in doc for s in _strings(item)]
    if isinstance(doc, dict):
        return [s for item in doc.values() for s in _strings(item)]
    return []


@SETTINGS
@given(doc=documents, content_type=st.sampled_from(CONTENT_TYPES))
def test_any_json_document_parses_or_gets_an_api_error_without_its_values(doc, content_type):
    _check(json.dumps(doc, allow_nan=True).encode(), content_type)


@SETTINGS
@given(doc=near_valid)
def test_near_valid_documents_parse_or_get_an_api_error_without_their_values(doc):
    body = json.dumps(doc, allow_nan=True).encode()
    try:
        parse_scoring_request(body, "application/json", max_rows=5)
    except ApiError as err:
        assert err.status_code in (400, 413)
        for value in _strings(doc):
            if value.startswith(MARK):
                assert value not in err.message, err.message
        return


@SETTINGS
@given(body=st.binary(max_size=300), content_type=st.sampled_from(CONTENT_TYPES))
def test_arbitrary_bytes_never_raise_anything_but_an_api_error(body, content_type):
    _check(body, content_type)


csv_cells = st.one_of(
    st.integers(), st.floats(allow_nan=True), st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=8)
)


@SETTINGS
@given(
    header=st.lists(st.text(max_size=6), min_size=1, max_size=4),
    cells=st.lists(st.lists(csv_cells, max_size=5), max_size=8),
    sep=st.sampled_from([",", ";", "\t"]),
    quote=st.booleans(),
)
def test_csv_bodies_parse_or_get_an_api_error(header, cells, sep, quote):
    def cell(value: object) -> str:
        text = str(value)
        return '"' + text.replace('"', '""') + '"' if quote else text

    lines = [sep.join(cell(h) for h in header), *(sep.join(cell(c) for c in row) for row in cells)]
    _check("\n".join(lines).encode("utf-8", "surrogatepass"), "text/csv")


@SETTINGS
@given(depth=st.integers(min_value=1, max_value=20_000), opener=st.sampled_from(["[", '{"inputs":' * 1 + "["]))
def test_deep_nesting_and_huge_numbers_are_refused_cleanly(depth, opener):
    _check((opener + "[" * depth).encode(), "application/json")
    _check(b'{"inputs": [[' + b"9" * min(depth, 50_000) + b"]]}", "application/json")


def test_row_limit_is_413_for_every_format():
    row = {"customer_id": 1, "merchant_id": 2, "amount": 3.0}
    bodies = [
        {"dataframe_records": [row] * 6},
        {"dataframe_split": {"columns": list(row), "data": [list(row.values())] * 6}},
        {"instances": [list(row.values())] * 6},
        {"inputs": {k: [v] * 6 for k, v in row.items()}},
    ]
    for body in bodies:
        try:
            parse_scoring_request(json.dumps(body).encode(), "application/json", max_rows=5)
        except ApiError as err:
            assert err.status_code == 413, body
        else:
            raise AssertionError(f"{next(iter(body))} over the row limit was accepted")
    csv = ("a,b\n" + "1,2\n" * 6).encode()
    try:
        parse_scoring_request(csv, "text/csv", max_rows=5)
    except ApiError as err:
        assert err.status_code == 413
    else:
        raise AssertionError("CSV over the row limit was accepted")
