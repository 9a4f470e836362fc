"""One chunk of a batch run: its slice of the input, and how it is scored and written.

A chunk is at most ``chunk_rows`` rows of one parquet row group, so a worker holds one row group's
needed columns and one chunk's features at a time, whatever the input's size. ``score_chunk`` is the
unit both engines run (in process, or as a Dask task): it joins the chunk's features point in time
through the model's FeatureService (``get_historical_features``; its on-demand views fed only their
inputs, see ``feature_repo.retrieval``) or, for a model without one, takes
the model's columns from the chunk itself (features given, no feature store), predicts, and writes
the rows of each date to ``part-<chunk>.parquet`` in the run's staging directory. Names depend only on the chunk,
so a retried task overwrites its own files and both engines produce the same files.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from feature_repo import retrieval
from serving.batch import output_layout
from serving.batch.input_check import TIMESTAMP, InputPlan, InputSpec

log = logging.getLogger(__name__)

ROW_POSITION = "__tollfree_row"
PREDICTION = "prediction"


@dataclass(frozen=True)
class Chunk:
    index: int
    path: str
    row_group: int | None  # None: the whole file
    start: int
    length: int


@dataclass(frozen=True)
class ScoringContext:
    """Everything a worker needs to score a chunk; small and picklable."""

    home: str
    tracking_uri: str
    model_uri: str  # pinned: models:/NAME/VERSION, so every chunk uses the same version
    model_version: str
    service_name: str | None  # None: features given, the model's columns are read from the input (spec.model_columns)
    spec: InputSpec
    run_id: str
    staging: str


@dataclass(frozen=True)
class ChunkResult:
    index: int
    rows: int
    rows_without_features: int
    files: tuple[tuple[str, int], ...]  # (path relative to the run directory, rows)
    seconds: dict[str, float]


def plan_chunks(plan: InputPlan, chunk_rows: int) -> list[Chunk]:
    """Cut every row group of every file into slices of at most ``chunk_rows`` rows, in input order."""
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be > 0, got {chunk_rows}")
    chunks: list[Chunk] = []
    for file in plan.files:
        groups = [(None, file.rows)] if file.whole else list(enumerate(file.row_groups))
        for group, rows in groups:
            for start in range(0, rows, chunk_rows):
                chunks.append(Chunk(len(chunks), file.path, group, start, min(chunk_rows, rows - start)))
    return chunks


@functools.lru_cache(maxsize=2)
def _resources(home: str, tracking_uri: str, model_uri: str, service_name: str) -> tuple[Any, Any, Any, list[str]]:
    """The feature store, FeatureService, model and feature order, loaded once per worker process."""
    import mlflow
    import mlflow.pyfunc

    from feature_repo import store as feature_store

    mlflow.set_tracking_uri(tracking_uri)
    _quiet_duckdb()
    store = feature_store.open_store(Path(home))
    service = feature_store.feature_service(store, service_name)
    model = mlflow.pyfunc.load_model(model_uri)
    schema = model.metadata.get_input_schema()
    names = (
        schema.input_names()
        if schema is not None and schema.has_input_names()
        else feature_store.feature_names(service)
    )
    return store, service, model, list(names)


@functools.lru_cache(maxsize=2)
def _model(tracking_uri: str, model_uri: str) -> Any:
    """The pyfunc model alone (features given: no feature store), loaded once per worker process."""
    import mlflow
    import mlflow.pyfunc

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.pyfunc.load_model(model_uri)


def preload(home: str, tracking_uri: str, model_uri: str, service_name: str | None) -> None:
    """Load now, in this process, what ``score_chunk`` will need (the local engine does it while the input is
    validated in a child process); ``home`` as the ``ScoringContext`` holds it (resolved)."""
    if service_name is None:
        _model(tracking_uri, model_uri)
    else:
        _resources(home, tracking_uri, model_uri, service_name)


def _quiet_duckdb() -> None:
    """DuckDB draws a progress bar on stderr for long queries; batch logs carry progress themselves."""
    import ibis

    try:
        ibis.get_backend().raw_sql("SET enable_progress_bar = false")
    except Exception as exc:  # an offline store that is not DuckDB: nothing to silence
        log.debug("could not turn off the DuckDB progress bar: %s", exc)


_local = threading.local()


def _row_group(path: str, group: int | None, columns: list[str]) -> pa.Table:
    """One row group's columns (or the whole file's); the last one read is kept, as consecutive chunks share it."""
    key = (path, group, tuple(columns))
    cached = getattr(_local, "row_group", None)
    if cached is None or cached[0] != key:
        _local.row_group = None  # drop the previous one before reading the next
        source = pq.ParquetFile(path)
        table = source.read(columns=columns) if group is None else source.read_row_group(group, columns=columns)
        cached = (key, table)
        _local.row_group = cached
    return cached[1]


@dataclass(frozen=True)
class JoinedChunk:
    """A chunk's rows with their batch views joined (``join_chunk``), waiting for ``finish_chunk``."""

    entities: int
    views: retrieval.JoinedViews
    seconds: dict[str, float]


def score_chunk(ctx: ScoringContext, chunk: Chunk) -> ChunkResult:
    """Features, predictions and output files of one chunk (runs in the driver or a Dask worker)."""
    if ctx.service_name is None:
        return finish_given(ctx, chunk, read_given(ctx, chunk))
    return finish_chunk(ctx, chunk, join_chunk(ctx, chunk))


def join_chunk(ctx: ScoringContext, chunk: Chunk) -> JoinedChunk:
    """The part of a chunk that uses the feature store: read its rows, join its batch views point in time.
    One at a time per process (the offline store's connection is not for concurrent queries)."""
    started = time.perf_counter()
    store, service, _, _ = _resources(ctx.home, ctx.tracking_uri, ctx.model_uri, ctx.service_name)
    entities = _row_group(chunk.path, chunk.row_group, ctx.spec.columns).slice(chunk.start, chunk.length).to_pandas()
    entities[TIMESTAMP] = pd.to_datetime(entities[TIMESTAMP], utc=True).dt.floor("us")
    entities[ROW_POSITION] = np.arange(len(entities), dtype=np.int64)
    read = time.perf_counter()
    views = retrieval.join_batch_views(store, service, entities)
    return JoinedChunk(len(entities), views, {"read": read - started, "features": time.perf_counter() - read})


def finish_chunk(ctx: ScoringContext, chunk: Chunk, joined: JoinedChunk) -> ChunkResult:
    """The rest, with no store access: on-demand features, input order, predict, write."""
    started = time.perf_counter()
    _, _, model, names = _resources(ctx.home, ctx.tracking_uri, ctx.model_uri, ctx.service_name)
    features = retrieval.with_on_demand_features(joined.views)
    if len(features) != joined.entities:
        raise RuntimeError(
            f"feature retrieval returned {len(features)} rows for {joined.entities} in chunk {chunk.index}"
        )
    features = features.sort_values(ROW_POSITION, kind="stable").reset_index(drop=True)
    joined_at = time.perf_counter()

    complete = features[names].notna().all(axis=1).to_numpy()
    scores = np.full(len(features), np.nan)
    if complete.any():
        scores[complete] = _positive_scores(model.predict(features.loc[complete, names]))
    predicted = time.perf_counter()

    files = _write_by_date(
        features[ctx.spec.key].to_numpy(), _timestamps(features[TIMESTAMP]), scores, ctx, chunk.index
    )
    done = time.perf_counter()
    return ChunkResult(
        chunk.index,
        len(scores),
        int((~complete).sum()),
        files,
        {
            "read": joined.seconds["read"],
            "features": joined.seconds["features"] + joined_at - started,
            "predict": predicted - joined_at,
            "write": done - predicted,
        },
    )


@dataclass(frozen=True)
class GivenChunk:
    """A features-given chunk's rows as read (``read_given``), waiting for ``finish_given``."""

    rows: pd.DataFrame
    timestamps: Any
    read_s: float


def read_given(ctx: ScoringContext, chunk: Chunk) -> GivenChunk:
    """A features-given chunk's rows and output timestamps, read from its row group."""
    started = time.perf_counter()
    rows = _row_group(chunk.path, chunk.row_group, ctx.spec.columns).slice(chunk.start, chunk.length).to_pandas()
    timestamps = _timestamps(pd.to_datetime(rows[TIMESTAMP], utc=True).dt.floor("us"))  # as the join path's
    return GivenChunk(rows, timestamps, time.perf_counter() - started)


def finish_given(ctx: ScoringContext, chunk: Chunk, given: GivenChunk) -> ChunkResult:
    """Predictions straight from the chunk's own columns (the model's signature inputs); no join, no store."""
    read = time.perf_counter()
    model = _model(ctx.tracking_uri, ctx.model_uri)
    names = [c.name for c in ctx.spec.model_columns]
    rows, timestamps = given.rows, given.timestamps
    scores = _positive_scores(model.predict(rows[names]))
    predicted = time.perf_counter()

    files = _write_by_date(rows[ctx.spec.key].to_numpy(), timestamps, scores, ctx, chunk.index)
    done = time.perf_counter()
    return ChunkResult(
        chunk.index,
        len(scores),
        0,
        files,
        {"read": given.read_s, "features": 0.0, "predict": predicted - read, "write": done - predicted},
    )


def _timestamps(column: pd.Series) -> Any:
    """The output's timestamp column: nanoseconds, time zone kept (what ``to_numpy()`` and re-inference gave, but
    without a Python object per row: that round trip cost ~6 s per million rows)."""
    return column.dt.as_unit("ns").array


def _positive_scores(raw: Any) -> np.ndarray:
    """One score per row: the positive-class probability of a binary classifier, or the model's output."""
    values = np.asarray(raw)
    if values.ndim == 2 and values.shape[1] == 2:
        return values[:, 1].astype(float)
    if values.ndim == 2 and values.shape[1] == 1:
        return values[:, 0].astype(float)
    if values.ndim == 1:
        return values.astype(float)
    raise ValueError(f"batch scoring writes one score per row; the model returned shape {values.shape}")


def _write_by_date(
    keys: Any, timestamps: Any, scores: np.ndarray, ctx: ScoringContext, chunk_index: int
) -> tuple[tuple[str, int], ...]:
    """One parquet file per day of ``timestamps`` (rows in input order), each fsynced. The table is built in
    Arrow: the run's constant columns are one value taken ``n`` times, not ``n`` Python strings (through
    pandas, the two string columns were half of the write's time)."""
    staging = Path(ctx.staging)
    n = len(scores)
    first = pa.array(np.zeros(n, dtype=np.int32))
    table = pa.table(
        {
            ctx.spec.key: keys,
            TIMESTAMP: pa.array(timestamps),
            PREDICTION: pa.array(scores, from_pandas=True),  # NaN (no features) -> null
            "model_version": pa.array([ctx.model_version]).take(first),
            "run_id": pa.array([ctx.run_id]).take(first),
        }
    )
    table = table.replace_schema_metadata(
        {
            b"tollfree.run_id": ctx.run_id.encode(),
            b"tollfree.model_uri": ctx.model_uri.encode(),
            b"tollfree.model_version": ctx.model_version.encode(),
        }
    )
    codes, days = pd.factorize(pd.Series(timestamps).dt.floor("D"), sort=True)  # a missing time: code -1, no file
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(days) + 1))
    written = []
    for i, day in enumerate(days):
        path = output_layout.part_path(staging, ctx.model_version, day.strftime("%Y-%m-%d"), chunk_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.take(pa.array(order[bounds[i] : bounds[i + 1]])), path)
        _fsync_file(path)
        written.append((str(path.relative_to(staging)), int(bounds[i + 1] - bounds[i])))
    return tuple(written)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
