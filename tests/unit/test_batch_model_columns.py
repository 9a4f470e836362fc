"""A model's own input columns (no FeatureService): signature to columns, the parquet types each takes."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from mlflow.types import ColSpec, Schema, TensorSpec

from serving.batch import input_check
from serving.batch.input_check import InputSpec
from serving.batch.model_columns import ModelColumn, from_signature, type_problem


@pytest.mark.parametrize(
    ("kind", "accepted", "refused"),
    [
        (
            "long",
            [pa.int64(), pa.int32(), pa.int8(), pa.uint32()],
            [pa.float64(), pa.uint64(), pa.string(), pa.bool_()],
        ),
        ("integer", [pa.int32(), pa.int16(), pa.uint16()], [pa.int64(), pa.uint32(), pa.float32()]),
        ("double", [pa.float64(), pa.float32(), pa.int32(), pa.uint16()], [pa.int64(), pa.uint64(), pa.string()]),
        ("float", [pa.float32(), pa.float16()], [pa.float64(), pa.int32()]),
        ("boolean", [pa.bool_()], [pa.int8(), pa.string()]),
        ("string", [pa.string(), pa.large_string()], [pa.binary(), pa.int64()]),
        ("binary", [pa.binary(), pa.large_binary()], [pa.string()]),
        ("datetime", [pa.timestamp("us"), pa.timestamp("ns")], [pa.timestamp("us", tz="UTC"), pa.date32()]),
    ],
)
def test_types_follow_what_mlflow_schema_enforcement_accepts(kind, accepted, refused):
    column = ModelColumn("x", kind)
    for t in accepted:
        assert type_problem(column, t) is None, t
    for t in refused:
        problem = type_problem(column, t)
        assert problem is not None and problem.startswith("model input column x must be")
        assert f"signature type {kind}" in problem and str(t) in problem


def test_the_mlflow_enforcement_the_rules_mirror_refuses_int64_into_double():
    from mlflow.exceptions import MlflowException
    from mlflow.models.utils import _enforce_mlflow_datatype
    from mlflow.types import DataType

    with pytest.raises(MlflowException):
        _enforce_mlflow_datatype("x", pd.Series(np.array([5, 7], dtype=np.int64)), DataType.double)
    assert (
        _enforce_mlflow_datatype("x", pd.Series(np.array([5, 7], dtype=np.int32)), DataType.double).dtype == np.float64
    )


def test_signature_columns_keep_order_type_and_optionality():
    schema = Schema([ColSpec("double", "a"), ColSpec("long", "b"), ColSpec("double", "c", required=False)])
    assert from_signature(schema, "models:/m/1") == (
        ModelColumn("a", "double"),
        ModelColumn("b", "long"),
        ModelColumn("c", "double", required=False),
    )


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (None, "neither a feature service nor a signature"),
        (Schema([TensorSpec(np.dtype("float64"), (-1, 3))]), "not one of named columns"),
        (Schema([ColSpec("double")]), "not one of named columns"),
    ],
    ids=["no-signature", "tensor", "unnamed"],
)
def test_unusable_signatures_are_refused_naming_the_model(schema, message):
    with pytest.raises(ValueError, match=message) as caught:
        from_signature(schema, "models:/plain/3 (version 3)")
    assert "models:/plain/3" in str(caught.value)


def test_only_optional_float_columns_may_hold_nulls():
    spec = InputSpec(
        "id",
        (),
        (),
        (
            ModelColumn("a", "double"),
            ModelColumn("b", "double", required=False),
            ModelColumn("c", "long", required=False),
            ModelColumn("id", "long", required=False),
        ),
    )
    assert spec.features_given and spec.columns == ["id", "a", "b", "c", "event_timestamp"]
    assert spec.not_null == ["id", "a", "c", "event_timestamp"]
    assert not InputSpec("id", ("customer_id",), ("amount",)).features_given


def _write(tmp_path, frame: pd.DataFrame):
    path = tmp_path / "in.parquet"
    frame.to_parquet(path, index=False)
    return path


def test_footer_check_names_the_column_and_the_file_never_a_value(tmp_path):
    spec = InputSpec("id", (), (), (ModelColumn("spend", "double"), ModelColumn("count", "long")))
    ts = pd.Timestamp("2026-11-01", tz="UTC")
    good = pd.DataFrame(
        {
            "id": [1, 2],
            "spend": [12345.678, 2.5],
            "count": [3, 4],
            "event_timestamp": [ts, ts],
            "extra": ["ignored", "too"],
        }
    )
    plan = input_check.inspect(_write(tmp_path, good), spec)
    assert plan.rows == 2
    input_check.validate_values(plan, spec)

    path = _write(tmp_path, good.drop(columns=["count"]))
    with pytest.raises(input_check.BatchInputError, match=f"{path} is missing column\\(s\\): count"):
        input_check.inspect(path, spec)
    path = _write(tmp_path, good.assign(spend=good["spend"].astype(str)))
    with pytest.raises(input_check.BatchInputError) as caught:
        input_check.inspect(path, spec)
    assert str(path) in str(caught.value) and "model input column spend must be a float" in str(caught.value)
    assert "12345" not in str(caught.value)
