"""Endpoint records in the state store: one row per endpoint, the record as JSON, every write one statement.

The store is SQLite in the state folder (the embedded default) or PostgreSQL (``TOLLFREE_STATE_URL``),
through SQLAlchemy Core; its schema is kept by Alembic (``serving.state.migrate``). Each row has a
``revision`` that every write bumps; records read from the store carry it, which lets
:meth:`EndpointStore.compare_and_set` detect any concurrent write, including one that kept the config
version (starting an update). Every check-and-write is one conditional ``UPDATE`` or ``INSERT``, atomic on
both databases, so two gateways (or threads, or processes) racing on one endpoint get one winner and a 409.

A database that does not answer is a 503 ``TEMPORARILY_UNAVAILABLE`` naming the store (its password
masked); nothing is half-written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from serving.endpoints.spec import EndpointRecord, quote_name
from serving.protocol.errors import ApiError, already_exists, conflict, not_found, unavailable
from serving.state.changes import notify
from serving.state.database import Database, StateStoreError, open_database
from serving.state.lease import Fence
from serving.state.migrate import ensure_schema
from serving.state.schema import autoscaler_state, endpoints

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _notified(db: Connection, result: T) -> T:
    notify(db)  # sent only if the transaction commits (and harmless when nothing changed)
    return result


def _missing(name: str) -> ApiError:
    return not_found(f"serving endpoint {quote_name(name)} does not exist")


class EndpointStore:
    """CRUD on :class:`EndpointRecord`, with Databricks errors (404, 409, 503) for the API to pass on.

    ``location`` is a SQLAlchemy URL or a path to a SQLite file. Opening migrates the schema to this
    code's head (``migrate=False``: refuse instead, naming the command to run).
    """

    def __init__(self, location: str | Path, timeout_s: float = 30.0, *, migrate: bool = True) -> None:
        self.database: Database = open_database(location, timeout_s)
        try:
            ensure_schema(self.database, migrate=migrate)
        except DBAPIError as exc:
            raise StateStoreError(f"the state store {self.shown} did not answer: {self.database.reason(exc)}") from None

    @property
    def shown(self) -> str:
        return self.database.shown

    def close(self) -> None:
        self.database.engine.dispose()

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        try:
            with self.database.engine.begin() as connection:
                yield connection
        except IntegrityError:
            raise
        except DBAPIError as exc:
            # connection refused, server gone, lock wait timed out: the caller may retry; never the password
            logger.warning("state store %s failed: %s", self.shown, self.database.reason(exc))
            raise unavailable(f"the state store {self.shown} did not answer; retry later") from None

    def _read(self, work: Callable[[Connection], T]) -> T:
        with self._transaction() as connection:
            return work(connection)

    def create(self, record: EndpointRecord) -> EndpointRecord:
        """Insert a new endpoint; 409 RESOURCE_ALREADY_EXISTS if the name is taken."""
        text = record.to_json()
        try:
            with self._transaction() as db:
                db.execute(
                    insert(endpoints).values(
                        name=record.name, config_version=record.config_version, revision=1, record=text
                    )
                )
                notify(db)
        except IntegrityError:
            raise already_exists(f"serving endpoint {quote_name(record.name)} already exists") from None
        logger.info("endpoint stored name=%s", record.name)
        record.revision = 1
        return record

    def get(self, name: str) -> EndpointRecord:
        row = self._read(
            lambda db: db.execute(
                select(endpoints.c.record, endpoints.c.revision).where(endpoints.c.name == name)
            ).first()
        )
        if row is None:
            raise _missing(name)
        return EndpointRecord.from_json(row[0], revision=row[1])

    def list(self) -> list[EndpointRecord]:
        """Every endpoint, sorted by name (byte order on both databases)."""
        rows = self._read(lambda db: db.execute(select(endpoints.c.record, endpoints.c.revision)).all())
        records = [EndpointRecord.from_json(text, revision=revision) for text, revision in rows]
        return sorted(records, key=lambda r: r.name.encode())

    def put(self, record: EndpointRecord, fence: Fence | None = None) -> EndpointRecord:
        """Overwrite an existing endpoint unconditionally; 404 if it does not exist. With ``fence``, a leader's
        write: StaleLeader (nothing written) once its lease is another's."""
        text = record.to_json()
        statement = (
            update(endpoints)
            .where(endpoints.c.name == record.name)
            .values(record=text, config_version=record.config_version, revision=endpoints.c.revision + 1)
            .returning(endpoints.c.revision)
        )

        def write(db: Connection) -> Any:
            if fence is not None:
                fence.check(db)
            return _notified(db, db.execute(statement).first())

        row = self._read(write)
        if row is None:
            raise _missing(record.name)
        record.revision = row[0]
        return record

    def compare_and_set(
        self, name: str, expected_config_version: int, record: EndpointRecord, fence: Fence | None = None
    ) -> EndpointRecord:
        """Write ``record`` only if the stored one still has ``expected_config_version``.

        If ``record.revision`` is set (records read from this store carry it), the stored row must
        also still be at that revision: any write since the read makes this fail. A failed check is
        a 409 RESOURCE_CONFLICT; a missing endpoint a 404. ``record.revision`` is updated on success.
        With ``fence``, a leader's write: StaleLeader (nothing written) once its lease is another's.
        """
        if record.name != name:
            raise ValueError("compare_and_set: record.name differs from name")
        text = record.to_json()
        condition = (endpoints.c.name == name) & (endpoints.c.config_version == expected_config_version)
        if record.revision:
            condition = condition & (endpoints.c.revision == record.revision)
        statement = (
            update(endpoints)
            .where(condition)
            .values(record=text, config_version=record.config_version, revision=endpoints.c.revision + 1)
            .returning(endpoints.c.revision)
        )

        def attempt(db: Connection) -> tuple[int | None, tuple[int, int] | None]:
            if fence is not None:
                fence.check(db)
            row = db.execute(statement).first()
            if row is not None:
                notify(db)
                return row[0], None
            found = db.execute(
                select(endpoints.c.config_version, endpoints.c.revision).where(endpoints.c.name == name)
            ).first()
            return None, (found[0], found[1]) if found is not None else None

        revision, found = self._read(attempt)
        if revision is None:
            if found is None:
                raise _missing(name)
            raise conflict(
                f"serving endpoint {quote_name(name)} was changed concurrently"
                f" (config version {found[0]}, expected {expected_config_version}); reload it and retry"
            )
        record.revision = revision
        return record

    def delete(self, name: str) -> None:
        """Remove an endpoint, and with it its autoscaler's recorded state (an endpoint created again under the
        name starts afresh, as a new endpoint); 404 if it does not exist."""

        def work(db: Connection) -> int:
            gone = db.execute(delete(endpoints).where(endpoints.c.name == name)).rowcount
            db.execute(delete(autoscaler_state).where(autoscaler_state.c.endpoint == name))
            return _notified(db, gone)

        gone = self._read(work)
        if gone == 0:
            raise _missing(name)
        logger.info("endpoint deleted name=%s", name)
