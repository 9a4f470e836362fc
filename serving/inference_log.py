"""Inference log: every gateway request, written off the request path as hive-partitioned parquet.

``record()`` only appends to an in-memory queue; a daemon thread writes one parquet file per
``(endpoint, date)`` partition per flush, atomically (hidden ``.tmp`` file + ``os.replace``).
Write failures never reach the caller: they are counted as ``lost`` and logged with the count only,
since request payloads must never end up in logs. Layout::

    folder/endpoint=<percent-encoded name>/date=<YYYY-MM-DD>/part-<UTC time>-<uuid8>.parquet
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prometheus_client import CollectorRegistry, Counter, Gauge

if TYPE_CHECKING:
    import pandas as pd  # only the reader returns frames: writing records needs no pandas

logger = logging.getLogger(__name__)


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class InferenceRecord:
    request_id: str
    timestamp: datetime  # tz-aware UTC; a naive value is taken as UTC
    endpoint: str
    served_entity: str | None
    model_version: str | None
    status_code: int
    latency_ms: float
    inputs: str | None  # JSON text of the request rows
    served_features: str | None  # JSON text: list of feature dicts, one per row
    outputs: str | None  # JSON text of the predictions
    error_code: str | None
    rows: int
    input_tokens: int | None = None  # chat requests: the usage (reported by the model, else estimated)
    output_tokens: int | None = None
    shadow: bool | None = None  # True: a shadow's answer to a copy of request_id, never sent to the client
    device: str | None = None  # an edge device's id: a request it answered on the device, uploaded later


INFERENCE_LOG_SCHEMA: pa.Schema = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("timestamp", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("endpoint", pa.string(), nullable=False),
        pa.field("served_entity", pa.string()),
        pa.field("model_version", pa.string()),
        pa.field("status_code", pa.int32(), nullable=False),
        pa.field("latency_ms", pa.float64(), nullable=False),
        pa.field("inputs", pa.string()),
        pa.field("served_features", pa.string()),
        pa.field("outputs", pa.string()),
        pa.field("error_code", pa.string()),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("input_tokens", pa.int64()),
        pa.field("output_tokens", pa.int64()),
        pa.field("shadow", pa.bool_()),
        pa.field("device", pa.string()),
    ]
)


def _as_utc(ts: datetime) -> datetime:
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def endpoint_dirname(endpoint: str) -> str:
    """One path component for ``endpoint``: percent-encoded, so '/', '..' and '=' cannot escape."""
    return "endpoint=" + quote(endpoint, safe="")


def _to_table(records: list[InferenceRecord]) -> pa.Table:
    columns = {name: [getattr(r, name) for r in records] for name in INFERENCE_LOG_SCHEMA.names}
    table = pa.Table.from_pydict(columns, schema=INFERENCE_LOG_SCHEMA)
    for field in INFERENCE_LOG_SCHEMA:  # pyarrow does not enforce nullable=False by itself
        if not field.nullable and table.column(field.name).null_count:
            raise ValueError(f"null in required column {field.name}")
    return table


def _describe(exc: BaseException) -> str:
    # pyarrow conversion errors may quote the offending value, i.e. request payload: type only.
    if isinstance(exc, OSError):
        return f"{type(exc).__name__} [errno {exc.errno}] {exc.strerror}"
    return type(exc).__name__


class InferenceLogWriter:
    """Batches records in memory and writes them from a daemon thread; see the module docstring."""

    def __init__(
        self,
        folder: Path,
        *,
        flush_interval_s: float = 1.0,
        max_batch: int = 1000,
        max_pending: int = 100_000,
        clock: Callable[[], datetime] = utc_now,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if flush_interval_s <= 0 or max_batch < 1 or max_pending < 1:
            raise ValueError("flush_interval_s, max_batch and max_pending must be positive")
        self.folder = Path(folder)
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        self.max_pending = max_pending
        self._clock = clock
        self._queue: collections.deque[InferenceRecord] = collections.deque()
        self._lock = threading.Lock()  # guards _queue, dropped, _closed, _thread; held O(1)
        self._write_lock = threading.Lock()  # one writer at a time: background thread or flush()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.written = 0
        self.dropped = 0
        self.lost = 0
        self._m_written: Counter | None = None
        self._m_lost: Counter | None = None
        if registry is not None:
            self._m_written = Counter(
                "tollfree_inference_log_records_written", "Inference log records written to parquet.", registry=registry
            )
            self._m_lost = Counter(
                "tollfree_inference_log_records_lost",
                "Inference log records never written (queue full or write error).",
                ["reason"],
                registry=registry,
            )
            for reason in ("dropped", "write_error"):
                self._m_lost.labels(reason=reason)
            pending = Gauge(
                "tollfree_inference_log_pending", "Inference log records waiting to be written.", registry=registry
            )
            pending.set_function(lambda: self.pending)

    @property
    def pending(self) -> int:
        """Records queued and not yet taken by a flush (a batch being written is not counted)."""
        return len(self._queue)

    def stats(self) -> dict[str, int]:
        return {"written": self.written, "dropped": self.dropped, "lost": self.lost, "pending": self.pending}

    def start(self) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("inference log writer is closed")
            self._start_locked()

    def _start_locked(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="inference-log-writer", daemon=True)
            self._thread.start()

    def record(self, rec: InferenceRecord) -> None:
        """Queue ``rec``; O(1), no I/O, never raises. Drops (and counts) when full or closed."""
        with self._lock:
            if self._closed or len(self._queue) >= self.max_pending:
                self.dropped += 1
                if self._m_lost is not None:
                    self._m_lost.labels(reason="dropped").inc()
                return
            self._queue.append(rec)
            full = len(self._queue) >= self.max_batch
            if self._thread is None:
                self._start_locked()
        if full:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            stopping = self._closed  # read before draining: records queued before close get written
            try:
                self.flush()
            except Exception:  # flush() already contains write errors; keep the thread alive anyway
                logger.exception("inference log: unexpected error in writer thread")
            if stopping:
                return

    def flush(self) -> int:
        """Synchronously write everything pending; returns the number of records written."""
        with self._write_lock:
            with self._lock:
                batch = list(self._queue)
                self._queue.clear()
            if not batch:
                return 0
            groups: dict[tuple[str, str], list[InferenceRecord]] = collections.defaultdict(list)
            malformed: list[InferenceRecord] = []
            for rec in batch:
                try:
                    groups[(endpoint_dirname(rec.endpoint), _as_utc(rec.timestamp).date().isoformat())].append(rec)
                except Exception:  # not a str endpoint / datetime timestamp: cannot even be placed
                    malformed.append(rec)
            if malformed:
                self._count_lost(malformed, "<malformed>", TypeError())
            return sum(self._write_group(d, day, recs) for (d, day), recs in groups.items())

    def _write_group(self, dirname: str, day: str, records: list[InferenceRecord]) -> int:
        tmp: Path | None = None
        try:
            directory = self.folder / dirname / f"date={day}"
            name = f"part-{_as_utc(self._clock()):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}.parquet"
            tmp = directory / f".{name}.tmp"
            table = _to_table(records)
            directory.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, directory / name)
        except Exception as exc:
            try:
                if tmp is not None:
                    tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self._count_lost(records, records[0].endpoint, exc)
            return 0
        self.written += len(records)
        if self._m_written is not None:
            self._m_written.inc(len(records))
        return len(records)

    def _count_lost(self, records: list[InferenceRecord], endpoint: str, exc: BaseException) -> None:
        self.lost += len(records)
        if self._m_lost is not None:
            self._m_lost.labels(reason="write_error").inc(len(records))
        logger.error("inference log: lost %d records for endpoint %r (%s)", len(records), endpoint, _describe(exc))

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting records, write what is queued and stop the thread. Idempotent."""
        with self._lock:
            self._closed = True
            thread = self._thread
        if thread is None:
            self.flush()
            return
        self._wake.set()
        thread.join(timeout_s)
        if thread.is_alive():
            logger.warning("inference log: writer still busy after %.1fs, %d records pending", timeout_s, self.pending)

    def __enter__(self) -> InferenceLogWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _part_files(folder: Path, endpoint: str | None, since: datetime | None, until: datetime | None) -> Iterable[Path]:
    pattern = endpoint_dirname(endpoint) if endpoint is not None else "endpoint=*"
    first = _as_utc(since).date().isoformat() if since is not None else None
    last = _as_utc(until).date().isoformat() if until is not None else None
    for day_dir in sorted(folder.glob(f"{pattern}/date=*")):
        day = day_dir.name.removeprefix("date=")
        if (first is None or day >= first) and (last is None or day <= last):
            yield from sorted(day_dir.glob("part-*.parquet"))  # hidden .tmp files never match


def _conformed(table: pa.Table) -> pa.Table:
    """A part in today's schema: columns added since it was written (the token counts, the shadow mark, the device)
    come back null."""
    for field in INFERENCE_LOG_SCHEMA:
        if field.name not in table.column_names:
            table = table.append_column(field.name, pa.nulls(len(table), field.type))
    return table.select(INFERENCE_LOG_SCHEMA.names).cast(INFERENCE_LOG_SCHEMA)


def read_inference_log(
    folder: Path,
    endpoint: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    shadow: bool | None = False,
) -> pd.DataFrame:
    """All records (``since`` <= timestamp < ``until``), sorted by timestamp; empty frame if none. ``shadow``:
    False (the default) the requests clients sent, as answered to them; True the shadows' answers only; None both."""
    tables = [_conformed(pq.read_table(part)) for part in _part_files(Path(folder), endpoint, since, until)]
    table = pa.concat_tables(tables) if tables else INFERENCE_LOG_SCHEMA.empty_table()
    ts_type = INFERENCE_LOG_SCHEMA.field("timestamp").type
    if endpoint is not None:
        table = table.filter(pc.equal(table["endpoint"], endpoint))
    if since is not None:
        table = table.filter(pc.greater_equal(table["timestamp"], pa.scalar(_as_utc(since), ts_type)))
    if until is not None:
        table = table.filter(pc.less(table["timestamp"], pa.scalar(_as_utc(until), ts_type)))
    if shadow is not None:
        marked = pc.fill_null(table["shadow"], False)
        table = table.filter(marked if shadow else pc.invert(marked))
    table = table.sort_by([("timestamp", "ascending"), ("request_id", "ascending")])
    return table.to_pandas().reset_index(drop=True)
