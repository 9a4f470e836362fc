"""Endpoint records in SQLite: one row per endpoint, the record as JSON, every write one transaction.

Each call opens its own connection (WAL journal, ``synchronous=FULL``), so one store may be shared
by threads and by processes on the same file. Writers take the write lock up front (``BEGIN
IMMEDIATE``) and wait up to ``timeout_s`` for it. Each row has a ``revision`` that every write
bumps; records read from the store carry it, which lets :meth:`EndpointStore.compare_and_set`
detect any concurrent write, including one that kept the config version (starting an update).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from serving.endpoints.spec import EndpointRecord, quote_name
from serving.protocol.errors import ApiError, already_exists, not_found

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS endpoints (
    name TEXT PRIMARY KEY,
    config_version INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    record TEXT NOT NULL
)
"""


def _missing(name: str) -> ApiError:
    return not_found(f"serving endpoint {quote_name(name)} does not exist")


class EndpointStore:
    """CRUD on :class:`EndpointRecord`, with Databricks errors (404, 409) for the API to pass on."""

    def __init__(self, path: Path | str, timeout_s: float = 30.0) -> None:
        self.path = Path(path)
        self._timeout_s = timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # isolation_level=None: no implicit transactions; writes use _write's explicit one.
        db = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
        try:
            db.execute("PRAGMA synchronous=FULL")
            yield db
        finally:
            db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def create(self, record: EndpointRecord) -> EndpointRecord:
        """Insert a new endpoint; 409 RESOURCE_ALREADY_EXISTS if the name is taken."""
        text = record.to_json()
        try:
            with self._write() as db:
                db.execute(
                    "INSERT INTO endpoints (name, config_version, revision, record) VALUES (?, ?, 1, ?)",
                    (record.name, record.config_version, text),
                )
        except sqlite3.IntegrityError:
            raise already_exists(f"serving endpoint {quote_name(record.name)} already exists") from None
        logger.info("endpoint stored name=%s", record.name)
        record.revision = 1
        return record

    def get(self, name: str) -> EndpointRecord:
        with self._connect() as db:
            row = db.execute("SELECT record, revision FROM endpoints WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise _missing(name)
        return EndpointRecord.from_json(row[0], revision=row[1])

    def list(self) -> list[EndpointRecord]:
        """Every endpoint, sorted by name."""
        with self._connect() as db:
            rows = db.execute("SELECT record, revision FROM endpoints ORDER BY name").fetchall()
        return [EndpointRecord.from_json(text, revision=revision) for text, revision in rows]

    def put(self, record: EndpointRecord) -> EndpointRecord:
        """Overwrite an existing endpoint unconditionally; 404 if it does not exist."""
        text = record.to_json()
        with self._write() as db:
            row = db.execute(
                "UPDATE endpoints SET record = ?, config_version = ?, revision = revision + 1"
                " WHERE name = ? RETURNING revision",
                (text, record.config_version, record.name),
            ).fetchone()
        if row is None:
            raise _missing(record.name)
        record.revision = row[0]
        return record

    def compare_and_set(self, name: str, expected_config_version: int, record: EndpointRecord) -> EndpointRecord:
        """Write ``record`` only if the stored one still has ``expected_config_version``.

        If ``record.revision`` is set (records read from this store carry it), the stored row must
        also still be at that revision: any write since the read makes this fail. A failed check is
        a 409 RESOURCE_CONFLICT; a missing endpoint a 404. ``record.revision`` is updated on success.
        """
        if record.name != name:
            raise ValueError("compare_and_set: record.name differs from name")
        text = record.to_json()
        with self._write() as db:
            row = db.execute("SELECT config_version, revision FROM endpoints WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise _missing(name)
            version, revision = row
            if version != expected_config_version or (record.revision and revision != record.revision):
                raise ApiError(
                    409,
                    "RESOURCE_CONFLICT",
                    f"serving endpoint {quote_name(name)} was changed concurrently"
                    f" (config version {version}, expected {expected_config_version}); reload it and retry",
                )
            db.execute(
                "UPDATE endpoints SET record = ?, config_version = ?, revision = ? WHERE name = ?",
                (text, record.config_version, revision + 1, name),
            )
        record.revision = revision + 1
        return record

    def delete(self, name: str) -> None:
        """Remove an endpoint; 404 if it does not exist."""
        with self._write() as db:
            gone = db.execute("DELETE FROM endpoints WHERE name = ?", (name,)).rowcount
        if gone == 0:
            raise _missing(name)
        logger.info("endpoint deleted name=%s", name)
