"""The input suite in a child process (real child processes, real Great Expectations): the same verdict as
inline, no child left behind, and inline validation when the child is gone."""

from __future__ import annotations

import time

import pandas as pd
import pytest

from serving.batch import input_check, validation_process
from serving.batch.input_check import InputSpec

pytestmark = pytest.mark.slow  # real child processes importing Great Expectations

SPEC = InputSpec("transaction_id", ("customer_id",), ("amount",))


def _plan(tmp_path, frame: pd.DataFrame) -> input_check.InputPlan:
    path = tmp_path / "in.parquet"
    frame.to_parquet(path, index=False)
    return input_check.inspect(path, SPEC)


def _rows(n: int = 500) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "transaction_id": range(n),
            "customer_id": [i % 7 for i in range(n)],
            "amount": [float(i) for i in range(n)],
            "event_timestamp": pd.Timestamp("2026-11-01", tz="UTC"),
        }
    )


def test_the_child_passes_a_good_input_and_refuses_a_bad_one_with_the_inline_message(tmp_path):
    good = _plan(tmp_path, _rows())
    with validation_process.ValidationProcess() as child:
        child.submit(good, SPEC)
        child.verdict(good, SPEC)  # passes: returns
        assert not child.ready()  # taken: nothing left to take between chunks
        child.verdict(good, SPEC)  # a second call returns at once

    rows = _rows()
    rows.loc[rows.index % 9 == 0, "amount"] = None
    bad = _plan(tmp_path, rows)
    with pytest.raises(input_check.BatchInputError) as inline:
        input_check.validate_values(bad, SPEC)
    with validation_process.ValidationProcess() as child:
        child.submit(bad, SPEC)
        deadline = time.monotonic() + 120
        while not child.ready():  # the run polls this between chunks: it turns true once the child has its verdict
            assert time.monotonic() < deadline, "the child gave no verdict within 120 s"
            time.sleep(0.05)
        with pytest.raises(input_check.BatchInputError) as in_child:
            child.verdict(bad, SPEC)
        assert not child.ready()  # taken: a second call raises the same refusal at once, no inline pass
        with pytest.raises(input_check.BatchInputError) as again:
            child.verdict(bad, SPEC)
        assert again.value is in_child.value
    assert str(in_child.value) == str(inline.value)
    assert "amount: 56 row(s) fail" in str(in_child.value) and "123.0" not in str(in_child.value)


def test_a_child_never_handed_an_input_is_stopped_on_leaving():
    with validation_process.ValidationProcess() as child:
        process = child._child
        assert process is not None and process.poll() is None
    assert process.poll() is not None  # a run refused before validation leaves no process behind


def test_a_child_that_died_is_replaced_by_inline_validation(tmp_path):
    rows = _rows()
    rows.loc[3, "customer_id"] = None
    bad = _plan(tmp_path, rows.astype({"customer_id": "Int64"}))
    child = validation_process.ValidationProcess()
    child._child.kill()
    child._child.wait()
    child.submit(bad, SPEC)
    with pytest.raises(input_check.BatchInputError, match="customer_id: 1 row"):
        child.verdict(bad, SPEC)


def test_where_the_suite_runs():
    with pytest.raises(ValueError, match="validation must be one of auto, process, inline"):
        validation_process.wanted("elsewhere")
    assert validation_process.wanted("process") and not validation_process.wanted("inline")


def test_an_input_gone_before_the_child_reads_it_fails_as_inline_naming_the_file(tmp_path):
    plan = _plan(tmp_path, _rows())
    (tmp_path / "in.parquet").unlink()  # after the footer check, before the values are read
    with pytest.raises(FileNotFoundError) as inline:
        input_check.validate_values(plan, SPEC)
    with validation_process.ValidationProcess() as child:
        child.submit(plan, SPEC)
        with pytest.raises(FileNotFoundError) as in_child:
            child.verdict(plan, SPEC)
    assert "in.parquet" in str(in_child.value) and type(in_child.value) is type(inline.value)
