from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from serving import inference_log
from serving.inference_log import INFERENCE_LOG_SCHEMA, InferenceLogWriter, InferenceRecord, read_inference_log

T0 = datetime(2024, 3, 1, 23, 59, 58, 123456, tzinfo=UTC)
SECRET = "SECRET-PAYLOAD-42"
FIELDS = list(INFERENCE_LOG_SCHEMA.names)


def make(i: int, endpoint: str = "churn", ts: datetime | None = None, **kw: object) -> InferenceRecord:
    ok = i % 3 != 0
    values: dict[str, object] = {
        "request_id": f"req-{endpoint}-{i:05d}",
        "timestamp": ts if ts is not None else T0 + timedelta(milliseconds=i),
        "endpoint": endpoint,
        "served_entity": "churn-model-1" if ok else None,
        "model_version": "7" if ok else None,
        "status_code": 200 if ok else 429,
        "latency_ms": 1.25 + i,
        "inputs": f'[{{"customer_id": {i}, "note": "{SECRET} é"}}]' if ok else None,
        "served_features": '[{"tenure": 3.5}]' if ok else None,
        "outputs": "[0.25]" if ok else None,
        "error_code": None if ok else "REQUEST_LIMIT_EXCEEDED",
        "rows": 1 if ok else 0,
    }
    values.update(kw)
    return InferenceRecord(**values)  # type: ignore[arg-type]


def as_records(df: pd.DataFrame) -> list[InferenceRecord]:
    out = []
    for row in df.to_dict("records"):
        row = {k: (None if v is None or (isinstance(v, float) and pd.isna(v)) else v) for k, v in row.items()}
        row["timestamp"] = row["timestamp"].to_pydatetime()
        out.append(InferenceRecord(**row))
    return out


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def files(folder: Path, pattern: str = "*") -> list[Path]:
    return [p for p in folder.rglob(pattern) if p.is_file()]


def test_records_round_trip_exactly(tmp_path: Path) -> None:
    # Records span midnight UTC, so each endpoint lands in two date partitions.
    sent = [make(i, "churn") for i in range(2500)] + [make(i, "fraud/v2") for i in range(7)]
    with InferenceLogWriter(tmp_path, flush_interval_s=3600) as writer:
        for rec in sent:
            writer.record(rec)
    got = as_records(read_inference_log(tmp_path))
    assert sorted(got, key=lambda r: r.request_id) == sorted(sent, key=lambda r: r.request_id)
    assert writer.stats() == {"written": 2507, "dropped": 0, "lost": 0, "pending": 0}
    dates = {p.parent.name for p in files(tmp_path, "*.parquet")}
    assert dates == {"date=2024-03-01", "date=2024-03-02"}


def test_empty_read_has_schema_columns_and_dtypes(tmp_path: Path) -> None:
    df = read_inference_log(tmp_path / "missing")
    assert list(df.columns) == FIELDS and len(df) == 0
    assert str(df["timestamp"].dtype) == "datetime64[us, UTC]"


def test_close_flushes_everything_and_is_idempotent(tmp_path: Path) -> None:
    writer = InferenceLogWriter(tmp_path, flush_interval_s=3600, max_batch=10_000)
    for i in range(500):
        writer.record(make(i))
    assert writer.pending == 500 and files(tmp_path) == []  # nothing written before close
    writer.close()
    writer.close()
    assert len(read_inference_log(tmp_path)) == 500
    assert writer.stats() == {"written": 500, "dropped": 0, "lost": 0, "pending": 0}
    writer.record(make(999))  # after close: counted, not raised, not written
    assert writer.dropped == 1 and writer.pending == 0


def test_flush_is_synchronous_and_writes_one_file_per_partition(tmp_path: Path) -> None:
    clock = lambda: datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC)  # noqa: E731
    writer = InferenceLogWriter(tmp_path, flush_interval_s=3600, clock=clock)
    for i in range(5):
        writer.record(make(i, "a", ts=T0))
        writer.record(make(i, "b", ts=T0))
    assert writer.flush() == 10
    parts = files(tmp_path, "*.parquet")
    assert sorted(p.relative_to(tmp_path).parent.as_posix() for p in parts) == [
        "endpoint=a/date=2024-03-01",
        "endpoint=b/date=2024-03-01",
    ]
    assert all(p.name.startswith("part-20240102T030405000006Z-") for p in parts)
    assert writer.flush() == 0
    writer.close()


def test_background_thread_flushes_within_interval(tmp_path: Path) -> None:
    with InferenceLogWriter(tmp_path, flush_interval_s=0.05) as writer:
        writer.record(make(1))
        assert wait_for(lambda: writer.written == 1, timeout_s=2.0)
        assert len(read_inference_log(tmp_path)) == 1


def test_background_thread_flushes_at_max_batch(tmp_path: Path) -> None:
    with InferenceLogWriter(tmp_path, flush_interval_s=3600, max_batch=10) as writer:
        for i in range(9):
            writer.record(make(i))
        time.sleep(0.05)
        assert writer.written == 0
        writer.record(make(9))
        assert wait_for(lambda: writer.written == 10, timeout_s=2.0)


def test_max_pending_overflow_counts_dropped(tmp_path: Path) -> None:
    registry = CollectorRegistry()
    writer = InferenceLogWriter(tmp_path, flush_interval_s=3600, max_pending=5, registry=registry)
    for i in range(8):
        writer.record(make(i))
    assert (writer.pending, writer.dropped) == (5, 3)
    assert registry.get_sample_value("tollfree_inference_log_pending") == 5
    writer.close()
    assert writer.stats() == {"written": 5, "dropped": 3, "lost": 0, "pending": 0}
    sample = registry.get_sample_value
    assert sample("tollfree_inference_log_records_lost_total", {"reason": "dropped"}) == 3
    assert sample("tollfree_inference_log_records_lost_total", {"reason": "write_error"}) == 0
    assert sample("tollfree_inference_log_records_written_total") == 5
    assert sample("tollfree_inference_log_pending") == 0


def test_write_error_counts_lost_logs_count_only_and_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_replace = os.replace
    calls = {"n": 0}

    def replace_once_enospc(src: object, dst: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(inference_log.os, "replace", replace_once_enospc)
    registry = CollectorRegistry()
    writer = InferenceLogWriter(tmp_path, flush_interval_s=3600, registry=registry)
    for i in range(4):
        writer.record(make(i))
    with caplog.at_level(logging.ERROR, logger="serving.inference_log"):
        assert writer.flush() == 0
    assert writer.lost == 4 and writer.pending == 0
    assert len(caplog.records) == 1
    assert "lost 4 records" in caplog.text and SECRET not in caplog.text
    assert files(tmp_path, "*.tmp") == [] and files(tmp_path, ".*") == []
    writer.record(make(10))
    writer.close()
    assert read_inference_log(tmp_path)["request_id"].tolist() == ["req-churn-00010"]
    assert writer.stats() == {"written": 1, "dropped": 0, "lost": 4, "pending": 0}
    assert registry.get_sample_value("tollfree_inference_log_records_lost_total", {"reason": "write_error"}) == 4


def test_unwritable_folder_counts_lost_in_background_then_recovers(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a regular file where a directory should be")
    folder = blocker / "log"
    with InferenceLogWriter(folder, flush_interval_s=0.02) as writer:
        writer.record(make(1))
        assert wait_for(lambda: writer.lost == 1, timeout_s=2.0)
        assert writer.written == 0 and writer._thread is not None and writer._thread.is_alive()
        blocker.unlink()  # the operator fixes the disk
        writer.record(make(2))
        assert wait_for(lambda: writer.written == 1, timeout_s=2.0)
    assert read_inference_log(folder)["request_id"].tolist() == ["req-churn-00002"]


def test_record_does_not_block_while_writer_is_stuck_on_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_replace = os.replace
    in_io, release = threading.Event(), threading.Event()

    def slow_replace(src: object, dst: object) -> None:
        in_io.set()
        release.wait(10)
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(inference_log.os, "replace", slow_replace)
    writer = InferenceLogWriter(tmp_path, flush_interval_s=0.01)
    writer.record(make(0))
    assert in_io.wait(2.0)
    started = time.monotonic()
    for i in range(1, 1001):
        writer.record(make(i))
    assert time.monotonic() - started < 1.0
    assert writer.written == 0 and writer.pending == 1000
    release.set()
    writer.close()
    assert writer.stats() == {"written": 1001, "dropped": 0, "lost": 0, "pending": 0}


def test_reader_filters_by_endpoint_and_time(tmp_path: Path) -> None:
    base = datetime(2024, 5, 10, 12, tzinfo=UTC)
    with InferenceLogWriter(tmp_path, flush_interval_s=3600) as writer:
        for day in range(3):
            for ep in ("a", "b"):
                writer.record(make(day, ep, ts=base + timedelta(days=day)))
    assert set(read_inference_log(tmp_path, endpoint="a")["endpoint"]) == {"a"}
    assert len(read_inference_log(tmp_path, endpoint="a")) == 3
    window = read_inference_log(tmp_path, since=base + timedelta(days=1), until=base + timedelta(days=2))
    assert window["request_id"].tolist() == ["req-a-00001", "req-b-00001"]  # since inclusive, until exclusive
    df = read_inference_log(tmp_path, endpoint="b", since=base + timedelta(hours=1))
    assert df["request_id"].tolist() == ["req-b-00001", "req-b-00002"]
    late = read_inference_log(tmp_path, since=base + timedelta(days=9))
    assert late.empty and list(late.columns) == FIELDS
    assert read_inference_log(tmp_path, endpoint="nope").empty


def test_reader_skips_tmp_files(tmp_path: Path) -> None:
    with InferenceLogWriter(tmp_path, flush_interval_s=3600) as writer:
        writer.record(make(1))
    part = files(tmp_path, "*.parquet")[0]
    (part.parent / f".{part.name}.tmp").write_bytes(b"half-written garbage")
    assert len(read_inference_log(tmp_path)) == 1


@pytest.mark.parametrize("name", ["../evil", "..", "a/../../b", "/abs/path", "a=b%2F", "."])
def test_endpoint_name_cannot_escape_folder(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "log"
    with InferenceLogWriter(folder, flush_interval_s=3600) as writer:
        writer.record(make(1, name))
    assert [p.name for p in tmp_path.iterdir()] == ["log"]
    parts = files(tmp_path)
    assert len(parts) == 1 and parts[0].resolve().is_relative_to(folder.resolve())
    assert len(parts[0].relative_to(folder).parts) == 3  # endpoint=…/date=…/part-…
    assert read_inference_log(folder, endpoint=name)["endpoint"].tolist() == [name]
    assert read_inference_log(folder, endpoint="evil").empty


def test_concurrent_record_from_four_threads_loses_nothing(tmp_path: Path) -> None:
    writer = InferenceLogWriter(tmp_path, flush_interval_s=0.005, max_batch=100)
    barrier = threading.Barrier(4)

    def produce(t: int) -> None:
        barrier.wait()
        for i in range(2500):
            writer.record(make(i, f"ep{t}"))

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    writer.close()
    df = read_inference_log(tmp_path)
    assert len(df) == 10_000 and df["request_id"].is_unique
    assert writer.stats() == {"written": 10_000, "dropped": 0, "lost": 0, "pending": 0}
    assert files(tmp_path, ".*") == []


def test_malformed_records_are_lost_without_leaking_payload(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = InferenceLogWriter(tmp_path, flush_interval_s=3600)
    writer.record(make(1, "a", timestamp=None))  # cannot be partitioned
    writer.record(make(2, "b", status_code=SECRET))  # cannot be converted to int32
    writer.record(make(3, "c"))
    with caplog.at_level(logging.ERROR, logger="serving.inference_log"):
        assert writer.flush() == 1
    writer.close()
    assert writer.stats() == {"written": 1, "dropped": 0, "lost": 2, "pending": 0}
    assert SECRET not in caplog.text and len(caplog.records) == 2
    assert read_inference_log(tmp_path)["request_id"].tolist() == ["req-c-00003"]


def test_shadow_answers_are_read_only_when_asked_for(tmp_path: Path) -> None:
    client = [make(i, served_entity="a", status_code=200) for i in range(1, 4)]
    shadows = [make(i, served_entity="b", status_code=200, shadow=True) for i in range(1, 3)]
    with InferenceLogWriter(tmp_path, flush_interval_s=3600) as writer:
        for rec in [*client, *shadows]:
            writer.record(rec)
    assert set(read_inference_log(tmp_path)["served_entity"]) == {"a"}  # what clients were sent, by default
    assert list(read_inference_log(tmp_path, shadow=True)["served_entity"]) == ["b", "b"]
    assert len(read_inference_log(tmp_path, shadow=None)) == 5
