"""Opening the state store: its URL, an engine with the right settings, and errors that never show a password."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

STATE_URL_ENV = "TOLLFREE_STATE_URL"


class StateStoreError(RuntimeError):
    """The state store cannot be used as configured (bad URL, unreachable, schema not migrated)."""


def parse(location: str | Path) -> URL:
    """A SQLAlchemy URL for a path (SQLite) or a URL; ``postgresql://`` means psycopg 3."""
    if isinstance(location, Path):
        return make_url(f"sqlite:///{location}")
    try:
        url = make_url(location)
    except ArgumentError:
        raise StateStoreError(
            f"{STATE_URL_ENV} is not a database URL (expected sqlite:///PATH or "
            "postgresql://USER:PASSWORD@HOST:PORT/DB)"
        ) from None
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() not in ("sqlite", "postgresql"):
        raise StateStoreError(f"the state store must be SQLite or PostgreSQL, not {url.get_backend_name()[:32]!r}")
    return url


def shown(url: URL) -> str:
    """The URL as it may appear in a message or a log: the password masked."""
    return url.render_as_string(hide_password=True)


@dataclass(frozen=True)
class Database:
    url: URL
    engine: Engine

    @property
    def shown(self) -> str:
        return shown(self.url)

    @property
    def is_sqlite(self) -> bool:
        return self.url.get_backend_name() == "sqlite"

    def reason(self, exc: BaseException) -> str:
        """The driver's first line about a failure, without the password (drivers do not print it; be sure)."""
        text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        first = text[0] if text else type(exc).__name__
        if self.url.password:
            first = first.replace(str(self.url.password), "***")
        return first[:300]


# How long a PostgreSQL connection may go unanswered, each way. A network cut (not a crash) leaves both ends
# waiting in silence: the client for an answer, TCP's retransmissions for up to 15 minutes; the server for the
# client's next statement, holding its transaction's locks, the lease's row among them (``serving.state.lease``),
# until TCP's keepalive ends it after two hours. With these, a statement unanswered for 5 s fails on the
# gateway's side, an idle connection is found dead within about 9 s, and the server ends a transaction its
# client left idle for 5 s, which releases its locks well within the lease's TTL.
UNANSWERED_MS = 5000
LIVENESS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 2}


def postgres_liveness(url: URL) -> dict[str, Any]:
    """libpq's settings for :data:`UNANSWERED_MS` (a URL's own ``options`` are kept, and then it sets its own)."""
    out: dict[str, Any] = {**LIVENESS, "tcp_user_timeout": UNANSWERED_MS}
    if "options" not in url.query:
        out["options"] = f"-c idle_in_transaction_session_timeout={UNANSWERED_MS}"
    return out


def open_database(location: str | Path, timeout_s: float = 30.0) -> Database:
    """An engine for the store; SQLite files get WAL, ``synchronous=FULL`` and a busy wait of ``timeout_s``."""
    url = parse(location)
    if url.get_backend_name() == "sqlite":
        if url.database:
            Path(url.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": timeout_s})

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: sqlite3.Connection, _record: object) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
            cursor.close()
    else:
        # pool_pre_ping: a connection the server dropped (restart, failover) is replaced before it is used.
        engine = create_engine(
            url,
            pool_pre_ping=True,
            pool_size=4,
            max_overflow=4,
            connect_args={"connect_timeout": max(1, int(min(timeout_s, 10))), **postgres_liveness(url)},
        )
    return Database(url, engine)
