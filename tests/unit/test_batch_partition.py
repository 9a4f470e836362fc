"""Regrouping the batch input by entity-key range: every row kept once, ranges disjoint, deterministic."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from serving.batch import partition
from serving.batch.chunks import plan_chunks
from serving.batch.input_check import InputFile, InputPlan, InputSpec

SPEC = InputSpec("transaction_id", ("customer_id", "merchant_id"), ("amount",))


def _input(tmp_path, rows: int = 5000) -> InputPlan:
    rng = np.random.default_rng(1)
    frame = pd.DataFrame(
        {
            "transaction_id": np.arange(rows),
            "customer_id": rng.zipf(1.5, rows) % 900,  # skewed keys
            "merchant_id": rng.integers(1, 50, rows),
            "amount": rng.random(rows),
            "event_timestamp": pd.Timestamp("2026-11-01", tz="UTC") + pd.to_timedelta(np.arange(rows), unit="s"),
        }
    )
    path = tmp_path / "in.parquet"
    frame.to_parquet(path, index=False, row_group_size=1500)
    return InputPlan(
        str(path),
        (
            InputFile(
                str(path), tuple(g.num_rows for g in [pq.ParquetFile(path).metadata.row_group(i) for i in range(4)])
            ),
        ),
    )


def test_buckets_hold_every_row_once_in_disjoint_key_ranges(tmp_path):
    plan = _input(tmp_path)
    buckets = partition.plan_buckets(plan, "customer_id", 1000)
    assert buckets == partition.plan_buckets(plan, "customer_id", 1000)  # deterministic
    regrouped = partition.write_buckets(plan, SPEC, buckets, tmp_path / "work")
    assert regrouped.rows == plan.rows == 5000 and all(f.whole for f in regrouped.files)
    parts = [pd.read_parquet(f.path) for f in regrouped.files]
    assert sorted(pd.concat(parts)["transaction_id"]) == list(range(5000))
    ranges = [(p["customer_id"].min(), p["customer_id"].max()) for p in parts]
    assert all(hi < lo for (_, hi), (lo, _) in itertools.pairwise(ranges))  # disjoint, ascending
    assert list(parts[0].columns) == SPEC.columns
    chunks = plan_chunks(regrouped, 1000)
    assert sum(c.length for c in chunks) == 5000 and all(c.row_group is None for c in chunks)


def test_one_chunk_worth_of_rows_is_one_bucket(tmp_path):
    plan = _input(tmp_path)
    assert partition.plan_buckets(plan, "customer_id", 10_000).boundaries == ()


def test_buckets_fit_one_chunk_each_so_no_remainder_chunk_pays_a_join(tmp_path):
    rng = np.random.default_rng(4)
    rows = 20_000
    frame = pd.DataFrame(
        {
            "transaction_id": np.arange(rows),
            "customer_id": rng.integers(0, 5000, rows),
            "merchant_id": rng.integers(1, 50, rows),
            "amount": rng.random(rows),
            "event_timestamp": pd.Timestamp("2026-11-01", tz="UTC") + pd.to_timedelta(np.arange(rows), unit="s"),
        }
    )
    path = tmp_path / "uniform.parquet"
    frame.to_parquet(path, index=False)
    plan = InputPlan(str(path), (InputFile(str(path), (rows,)),))
    regrouped = partition.write_buckets(plan, SPEC, partition.plan_buckets(plan, "customer_id", 2000), tmp_path / "w")
    chunks = plan_chunks(regrouped, 2000)
    assert len(chunks) == len(regrouped.files) == 11 and max(c.length for c in chunks) <= 2000
    assert sum(c.length for c in chunks) == rows


def test_the_input_streams_in_order_in_batches_no_larger_than_asked(tmp_path):
    from serving.batch.input_check import stream_batches

    plan = _input(tmp_path)  # 5000 rows in row groups of 1500
    second = tmp_path / "second.parquet"
    pd.read_parquet(plan.files[0].path).assign(transaction_id=lambda f: f["transaction_id"] + 5000).to_parquet(
        second, index=False, row_group_size=5000
    )
    two = InputPlan(str(tmp_path), (*plan.files, InputFile(str(second), (5000,))))
    batches = list(stream_batches(two, ["transaction_id", "customer_id"], 1000))
    assert max(b.num_rows for b in batches) <= 1000
    assert batches[0].schema.names == ["transaction_id", "customer_id"]
    ids = np.concatenate([b.column(0).to_numpy() for b in batches])
    assert ids.tolist() == list(range(10_000))  # every row once, file by file, in row order
