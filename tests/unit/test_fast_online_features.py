"""The fast path's two shortcuts give what the slow path gives: the model frame, and transform outputs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from feast.type_map import feast_value_type_to_python_type, python_values_to_proto_values
from feast.value_type import ValueType

from serving.features.fast_reader import as_feast_returns, model_frame


def test_model_frame_is_the_frame_pandas_builds_from_the_lists():
    response = {
        "floats": [1.5, 2.0],
        "floats_with_none": [1.0, None],
        "ints": [1, 2],
        "ints_with_none": [1, None],
        "nones": [None, None],
        "strings": ["x", None],
        "bools": [True, False],
        "nan": [1.5, float("nan")],
        "huge": [2**63, 1],
    }
    got = model_frame(response, list(response))
    pd.testing.assert_frame_equal(got, pd.DataFrame(response), check_exact=True)


@pytest.mark.parametrize(
    ("values", "value_type"),
    [
        ([1.5, 0.0, -2.25, math.inf], ValueType.DOUBLE),
        ([1.5, float("nan")], ValueType.DOUBLE),
        ([np.float64(1.5), 2], ValueType.DOUBLE),
        ([0.1, 1 / 3], ValueType.FLOAT),
        ([1, 2**40], ValueType.INT64),
        ([1, None], ValueType.INT64),
        (2.5, ValueType.DOUBLE),
    ],
)
def test_transform_outputs_come_back_as_feast_returns_them(values, value_type):
    column = values if isinstance(values, list) else [values]
    want = [feast_value_type_to_python_type(p, value_type) for p in python_values_to_proto_values(column, value_type)]
    got = as_feast_returns(values, value_type)
    assert [type(v) for v in got] == [type(v) for v in want]
    assert got == want
