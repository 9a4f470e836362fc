"""Regroup the input by entity-key range, so each chunk's point-in-time join touches few keys.

Feast's DuckDB point-in-time join scans the whole feature table on every call and hash-joins it
with the chunk; DuckDB pushes the min/max of the chunk's join key into that scan. A chunk of rows in
input (time) order spans every customer, so every call probes the whole table; a chunk holding one
narrow range of customers skips most of it before the join: row by row, and whole row groups where
the table is stored sorted by key (``feature_repo.store.write_table``: 64k-row groups of disjoint key
ranges, whose min/max statistics DuckDB reads first). Measured here (1 M input rows, 16 M feature
rows): 100k rows of one customer range join in about half the time of 100k rows in input order; on
the sorted table a 200k-row chunk of one range took 2.7 s against 3.5 s on the table in time order.

Two streaming passes, memory bounded by one input batch: (1) a systematic sample of the key column
gives range boundaries for buckets of about equal size, a little under ``chunk_rows`` each (``BUCKET_FILL``)
so that sampling noise does not push a bucket over and leave a remainder chunk of a few rows, which
would pay a whole join of its own (measured: 10 buckets of ~100k rows made 16 chunks, six of them of
1 to 777 rows); (2) every input
batch is split by bucket and appended to that bucket's parquet file in the run's hidden staging
directory. Deterministic: the same input and chunk size give the same buckets, whatever the engine.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from serving.batch.input_check import InputFile, InputPlan, InputSpec, stream_batches

SAMPLE_ROWS = 200_000
BATCH_ROWS = 262_144
MAX_BUCKETS = 4096
BUCKET_FILL = 0.95  # target bucket size over chunk_rows; bucket sizes from the sample spread by about 1 %


@dataclass(frozen=True)
class Buckets:
    key: str
    boundaries: tuple[int, ...]  # bucket i holds keys in [boundaries[i-1], boundaries[i])

    def assign(self, keys: np.ndarray) -> np.ndarray:
        return np.searchsorted(np.asarray(self.boundaries, dtype=np.int64), keys, side="right")


def plan_buckets(plan: InputPlan, key: str, chunk_rows: int) -> Buckets:
    """Equal-frequency key ranges from a systematic sample of the key column (one streaming pass)."""
    wanted = 1 if plan.rows <= chunk_rows else min(MAX_BUCKETS, math.ceil(plan.rows / (chunk_rows * BUCKET_FILL)))
    if wanted == 1:
        return Buckets(key, ())
    stride = max(1, plan.rows // SAMPLE_ROWS)
    samples, offset = [], 0
    for batch in stream_batches(plan, [key], BATCH_ROWS):
        values = batch.column(0).to_numpy(zero_copy_only=False)
        first = (-offset) % stride
        samples.append(values[first::stride].astype(np.int64, copy=False))
        offset += len(values)
    sample = np.sort(np.concatenate(samples))
    cuts = np.quantile(sample, np.arange(1, wanted) / wanted, method="higher")
    return Buckets(key, tuple(int(c) for c in np.unique(cuts)))


def write_buckets(plan: InputPlan, spec: InputSpec, buckets: Buckets, folder: Path) -> InputPlan:
    """Every input row into its bucket's file under ``folder`` (second streaming pass); the new plan."""
    folder.mkdir(parents=True, exist_ok=True)
    writers: dict[int, pq.ParquetWriter] = {}
    schema: pa.Schema | None = None
    try:
        for batch in stream_batches(plan, spec.columns, BATCH_ROWS):
            if batch.num_rows == 0:
                continue
            table = pa.Table.from_batches([batch])
            schema = schema or table.schema
            ids = buckets.assign(table.column(buckets.key).to_numpy().astype(np.int64, copy=False))
            order = np.argsort(ids, kind="stable")
            ids_sorted = ids[order]
            table = table.take(pa.array(order))
            starts = np.flatnonzero(np.r_[True, ids_sorted[1:] != ids_sorted[:-1]])
            ends = np.r_[starts[1:], len(ids_sorted)]
            for start, end in zip(starts, ends):
                bucket = int(ids_sorted[start])
                if bucket not in writers:
                    writers[bucket] = pq.ParquetWriter(folder / f"bucket-{bucket:05d}.parquet", schema)
                writers[bucket].write_table(table.slice(start, end - start).cast(schema))
    except BaseException:
        for writer in writers.values():
            writer.close()
        shutil.rmtree(folder, ignore_errors=True)
        raise
    files = []
    for bucket in sorted(writers):
        writers[bucket].close()
        path = folder / f"bucket-{bucket:05d}.parquet"
        files.append(InputFile(str(path), (pq.ParquetFile(path).metadata.num_rows,), whole=True))
    return InputPlan(str(folder), tuple(files))
