"""Inference records kept on the device until they reach home.

One SQLite file (``FOLDER/telemetry.db``): every answered request is a row, whether or not home is reachable.
The buffer is bounded: past ``limit`` rows the oldest are dropped and counted (``dropped``), so a device offline
for weeks keeps its newest records and says how many it lost. ``batch`` hands the oldest rows out for upload;
``acknowledge`` deletes them once home answered 2xx, so a failed upload loses nothing; a retried one sends rows
home may have taken already, which it recognises by their ``seq`` (a row id that never goes back, even when
every row was deleted: AUTOINCREMENT) within the buffer's ``stream`` (a number drawn when the file was made, so
a device whose buffer was wiped starts a new sequence rather than one home would take for old rows).
"""

from __future__ import annotations

import json
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Any


class Telemetry:
    def __init__(self, path: Path, limit: int = 100_000) -> None:
        if limit < 1:
            raise ValueError("the telemetry limit must be at least 1 record")
        self.limit = limit
        self._lock = threading.Lock()
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        self._db.execute("INSERT OR IGNORE INTO counters VALUES ('dropped', 0)")
        self._db.execute("INSERT OR IGNORE INTO counters VALUES ('stream', ?)", (secrets.randbits(62),))
        self.stream = int(self._db.execute("SELECT value FROM counters WHERE name = 'stream'").fetchone()[0])
        self._count = int(self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    def record(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO records (body) VALUES (?)", (json.dumps(record),))
            over = self._count + 1 - self.limit
            if over > 0:
                self._db.execute(
                    "DELETE FROM records WHERE id IN (SELECT id FROM records ORDER BY id LIMIT ?)", (over,)
                )
                self._db.execute("UPDATE counters SET value = value + ? WHERE name = 'dropped'", (over,))
            self._db.execute("COMMIT")
            self._count += 1 - max(0, over)

    def batch(self, size: int) -> tuple[list[int], list[dict[str, Any]]]:
        """The oldest ``size`` records and their row ids (for ``acknowledge``); each record carries its id as
        ``seq``, which only grows on a device, so home can tell a record it already took from a new one."""
        with self._lock:
            rows = self._db.execute("SELECT id, body FROM records ORDER BY id LIMIT ?", (size,)).fetchall()
        return [r[0] for r in rows], [{**json.loads(r[1]), "seq": r[0]} for r in rows]

    def acknowledge(self, ids: list[int]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany("DELETE FROM records WHERE id = ?", [(i,) for i in ids])
            self._count = int(self._db.execute("SELECT COUNT(*) FROM records").fetchone()[0])
            self._db.execute("COMMIT")

    @property
    def pending(self) -> int:
        with self._lock:
            return self._count

    @property
    def dropped(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT value FROM counters WHERE name = 'dropped'").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()
