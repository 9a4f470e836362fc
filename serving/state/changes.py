"""Change notices between gateways sharing a PostgreSQL store: every write to the endpoints and the replica
table sends ``NOTIFY tollfree_state`` in its transaction (delivered at commit); each gateway LISTENs on
its own connection and wakes its leader or follower loop at once. Periodic checks stay as the fallback (a
notice lost while a listener reconnects costs at most one interval). SQLite: nothing is sent or heard.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Connection
from sqlalchemy.engine import URL

from serving.state.database import postgres_liveness

log = logging.getLogger(__name__)

CHANNEL = "tollfree_state"


def notify(connection: Connection) -> None:
    """Tell the other gateways, when the surrounding transaction commits, that the state changed."""
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(f"NOTIFY {CHANNEL}")


class ChangeListener:
    """A daemon thread holding a ``LISTEN`` connection (reconnecting after a failure) that calls ``on_change``
    for every notice."""

    def __init__(self, url: URL, on_change: Callable[[], None], *, poll_s: float = 1.0) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._shown = url.render_as_string(hide_password=True)
        self._liveness = postgres_liveness(url)  # a cut link ends the wait for notices, as it ends a statement's
        self._on_change = on_change
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="state-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self._poll_s + 1)

    def _run(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5, **self._liveness) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self._poll_s):
                            self._on_change()
            except psycopg.Error as exc:
                log.warning("listening to %s failed (%s); retrying", self._shown, type(exc).__name__)
                self._stop.wait(self._poll_s)
