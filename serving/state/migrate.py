"""Keeping the store's schema at this code's head with Alembic: migrate on start, or refuse with the command to run.

A database from before Alembic (the ``endpoints`` table, no version) is the first revision and is stamped
so. Migrations run one at a time: under an advisory lock on PostgreSQL (several gateways may start
together), under a file lock beside a SQLite file.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

from serving.state.database import Database, StateStoreError

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
UPGRADE_COMMAND = "python -m serving.state upgrade"
BASELINE = "0001"
_PG_LOCK_KEY = 0x7011F4EE  # pg_advisory_xact_lock key: "tollfree migrations"


def _config(connection: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _scripts() -> ScriptDirectory:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config)


def head() -> str:
    found = _scripts().get_current_head()
    assert found is not None, "no migration in serving/state/migrations/versions"
    return found


def _current(connection: Connection) -> str | None:
    revision = MigrationContext.configure(connection).get_current_revision()
    if revision is None and inspect(connection).has_table("endpoints"):
        return "pre-alembic"
    return revision


def current(database: Database) -> str | None:
    """The schema's revision: None for an empty database, ``pre-alembic`` for one from before migrations."""
    with database.engine.connect() as connection:
        return _current(connection)


@contextmanager
def _one_at_a_time(database: Database, connection: Connection) -> Iterator[None]:
    if not database.is_sqlite:
        connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
        yield
        return
    where = Path(database.url.database or "") if database.url.database not in (None, "", ":memory:") else None
    if where is None:
        yield
        return
    with open(where.with_name(where.name + ".migrate.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def upgrade(database: Database) -> tuple[str | None, str]:
    """Migrate to head; returns (revision before, revision after)."""
    with database.engine.begin() as connection, _one_at_a_time(database, connection):
        before = _current(connection)
        if before == "pre-alembic":
            command.stamp(_config(connection), BASELINE)
        command.upgrade(_config(connection), "head")
    return before, head()


def ensure_schema(database: Database, *, migrate: bool = True) -> None:
    """Bring the schema to head (``migrate``), or refuse naming the command; always refuse a newer schema."""
    target = head()
    with database.engine.connect() as connection:
        found = _current(connection)
    if found == target:
        return
    known = {script.revision for script in _scripts().walk_revisions()}
    if found not in (None, "pre-alembic") and found not in known:
        raise StateStoreError(
            f"the state store {database.shown} has schema revision {found}, which this version "
            f"of tollfree does not know (its newest is {target}): run a newer tollfree"
        )
    if not migrate:
        raise StateStoreError(
            f"the state store {database.shown} has schema revision {found or 'none'}, this "
            f"tollfree needs {target}: run `{UPGRADE_COMMAND}` with the same TOLLFREE_STATE_URL"
        )
    upgrade(database)
