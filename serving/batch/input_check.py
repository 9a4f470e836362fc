"""The batch input, checked: files, columns, types and rows before anything is written, values before the publish.

Structure (files, columns, types, row counts) comes from the parquet footers alone; values are then
validated by a Great Expectations suite streamed over the input in bounded batches, so a 10 M-row
input is checked in the memory of one batch (inline before the first chunk, or in a child process while
the chunks are scored into staging: ``validation_process``). Errors name the file, the column and what is wrong;
they never quote row values.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from serving.batch.model_columns import ModelColumn, type_problem

log = logging.getLogger(__name__)

TIMESTAMP = "event_timestamp"
VALIDATION_BATCH_ROWS = 1_000_000


class BatchInputError(ValueError):
    """The batch input cannot be scored as given; the message names the problem."""


@dataclass(frozen=True)
class InputFile:
    path: str
    row_groups: tuple[int, ...]  # rows per row group
    whole: bool = False  # read as one table (a bucket file of many small row groups), not by row group

    @property
    def rows(self) -> int:
        return sum(self.row_groups)


@dataclass(frozen=True)
class InputSpec:
    """What every input row must carry, and of which kind: the row key, ``event_timestamp`` and either what the
    model's FeatureService needs (entity keys, request fields) or, for a model without one, the model's own input
    columns (``model_columns``, from its signature: the features are given)."""

    key: str
    join_keys: tuple[str, ...]
    request_fields: tuple[str, ...]
    model_columns: tuple[ModelColumn, ...] = ()

    @property
    def features_given(self) -> bool:
        return bool(self.model_columns)

    @property
    def columns(self) -> list[str]:
        return list(
            dict.fromkeys(
                [self.key, *self.join_keys, *self.request_fields, *(c.name for c in self.model_columns), TIMESTAMP]
            )
        )

    @property
    def not_null(self) -> list[str]:
        """Columns that may hold no null: all of them but optional float model inputs (NaN reaches the model)."""
        nullable = {c.name for c in self.model_columns if c.nullable} - {
            self.key,
            *self.join_keys,
            *self.request_fields,
            TIMESTAMP,
        }
        return [c for c in self.columns if c not in nullable]


@dataclass(frozen=True)
class InputPlan:
    root: str
    files: tuple[InputFile, ...]

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def inspect(input_path: Path, spec: InputSpec) -> InputPlan:
    """Every parquet file of ``input_path`` (a file or a directory) with the needed columns and types."""
    path = Path(input_path)
    if not path.exists():
        raise FileNotFoundError(f"batch input not found: {path}")
    try:
        dataset = ds.dataset(str(path), format="parquet")
        files = [_inspect_file(fragment.path, spec) for fragment in dataset.get_fragments()]
    except (pa.ArrowInvalid, OSError) as exc:
        if isinstance(exc, BatchInputError):
            raise
        raise BatchInputError(f"batch input {path} is not readable parquet: {exc}") from exc
    if not files:
        raise BatchInputError(f"batch input {path} holds no parquet files")
    plan = InputPlan(str(path), tuple(files))
    if plan.rows == 0:
        raise BatchInputError(f"batch input {path} is empty (0 rows)")
    return plan


def _inspect_file(file_path: str, spec: InputSpec) -> InputFile:
    meta = pq.ParquetFile(file_path).metadata
    schema = meta.schema.to_arrow_schema()
    missing = [c for c in spec.columns if c not in schema.names]
    if missing:
        raise BatchInputError(f"batch input {file_path} is missing column(s): {', '.join(missing)}")
    for problem in _type_problems(schema, spec):
        raise BatchInputError(f"batch input {file_path}: {problem}")
    return InputFile(file_path, tuple(meta.row_group(i).num_rows for i in range(meta.num_row_groups)))


def _type_problems(schema: pa.Schema, spec: InputSpec) -> Iterable[str]:
    def kind(column: str) -> pa.DataType:
        return schema.field(column).type

    key_type = kind(spec.key)
    if not (pa.types.is_integer(key_type) or pa.types.is_string(key_type) or pa.types.is_large_string(key_type)):
        yield f"row key column {spec.key} must be an integer or a string, got {key_type}"
    for column in spec.join_keys:
        if not pa.types.is_integer(kind(column)):
            yield f"entity key column {column} must be an integer, got {kind(column)}"
    for column in spec.request_fields:
        if not (pa.types.is_integer(kind(column)) or pa.types.is_floating(kind(column))):
            yield f"request field {column} must be numeric, got {kind(column)}"
    for model_column in spec.model_columns:
        problem = type_problem(model_column, kind(model_column.name))
        if problem:
            yield problem
    if not pa.types.is_timestamp(kind(TIMESTAMP)):
        yield f"column {TIMESTAMP} must be a timestamp, got {kind(TIMESTAMP)}"


def stream_batches(plan: InputPlan, columns: list[str], batch_rows: int) -> Iterable[pa.RecordBatch]:
    """Every row of the input, in file and row-group order, as batches of at most ``batch_rows`` rows.

    One row group at a time, read in batches, with no read-ahead: memory stays at one batch whatever the
    input's size. (A pyarrow dataset scanner reads row groups ahead on threads: streaming a 10 M-row,
    40-row-group file through it peaked at 1.9 GB RSS against 0.36 GB for 1 M rows; this reader,
    validating, peaked at 0.54 GB against 0.52 GB.)
    """
    for file in plan.files:
        source = pq.ParquetFile(file.path)
        for group in range(source.metadata.num_row_groups):
            yield from source.iter_batches(
                batch_size=batch_rows, row_groups=[group], columns=columns, use_threads=False
            )


def input_suite(spec: InputSpec) -> list:
    """The Great Expectations suite every input batch must meet (no nulls in any needed column, see ``not_null``)."""
    import great_expectations as gx

    return [gx.expectations.ExpectColumnValuesToNotBeNull(column=c) for c in spec.not_null]


def validate_values(plan: InputPlan, spec: InputSpec, batch_rows: int = VALIDATION_BATCH_ROWS) -> float:
    """Run the suite over the whole input, batch by batch; the first failing batch raises naming the columns.
    Returns the seconds it took."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    started = time.perf_counter()
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    definition = (
        context.data_sources.add_pandas(name="batch-input")
        .add_dataframe_asset(name="rows")
        .add_batch_definition_whole_dataframe(name="batch")
    )
    suite = gx.ExpectationSuite(name="batch-input", expectations=input_suite(spec))
    seen = 0
    for batch in stream_batches(plan, spec.columns, batch_rows):
        if batch.num_rows == 0:
            continue
        result = definition.get_batch(batch_parameters={"dataframe": batch.to_pandas()}).validate(
            suite, result_format="BASIC"
        )
        if not result.success:
            problems = []
            for r in result.results:
                if not r.success:
                    res = r.result or {}
                    problems.append(
                        f"{r.expectation_config.kwargs.get('column')}: "
                        f"{res.get('unexpected_count', '?')} row(s) fail {r.expectation_config.type}"
                    )
            raise BatchInputError(
                f"batch input {plan.root} fails validation in rows {seen}..{seen + batch.num_rows - 1}: "
                + "; ".join(sorted(problems))
            )
        seen += batch.num_rows
    seconds = time.perf_counter() - started
    log.info(
        "batch input %s: %d rows passed %d expectations in %.2f s", plan.root, seen, len(suite.expectations), seconds
    )
    return seconds
