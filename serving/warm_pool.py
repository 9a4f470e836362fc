"""The warm pool: standby replica processes with the runtime already imported, waiting for a model.

A scale-up (or a scale from zero) takes one and loads its model into it (``local_replicas.activate``),
so a cold start costs the model load only, not the interpreter start and the imports (several seconds
here). The pool refills itself in the background after every take.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path

from serving.local_replicas import LocalReplica, ReplicaStartError, start_replica, stop_replica, wait_live

log = logging.getLogger(__name__)


class WarmPool:
    def __init__(self, size: int, log_dir: Path, env: Mapping[str, str]) -> None:
        if size < 0:
            raise ValueError("warm pool size must be >= 0")
        self.size = size
        self._log_dir = log_dir
        self._env = dict(env)
        self._idle: list[LocalReplica] = []
        self._booting: list[LocalReplica] = []  # started, not yet live: close() stops these too
        self._starting = 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def idle(self) -> int:
        with self._lock:
            return sum(r.alive() for r in self._idle)

    def fill(self) -> None:
        """Start standby processes until ``size`` are idle or starting (blocking; run it off the loop).
        The missing ones start together and are waited for together."""
        with self._lock:
            self._idle = [r for r in self._idle if r.alive()]
            missing = 0 if self._closed else self.size - len(self._idle) - self._starting
            if missing <= 0:
                return
            self._starting += missing
        started: list[LocalReplica] = []
        try:
            for _ in range(missing):
                replica = start_replica("", self._log_dir, self._env)
                started.append(replica)
                with self._lock:
                    self._booting.append(replica)
        except OSError as exc:
            log.warning("warm pool: could not start a standby replica: %s", exc)
        for replica in started:
            try:
                wait_live(replica)
            except ReplicaStartError as exc:
                log.warning("warm pool: a standby replica failed to start: %s", exc)
                stop_replica(replica)
                continue
            with self._lock:
                if replica in self._booting:
                    self._booting.remove(replica)
                if self._closed:
                    stop_replica(replica)
                else:
                    self._idle.append(replica)
        with self._lock:
            self._starting -= missing
            for replica in started:
                if replica in self._booting:
                    self._booting.remove(replica)

    def take(self) -> LocalReplica | None:
        """An idle standby process, or None (the caller then starts a replica cold)."""
        with self._lock:
            while self._idle:
                replica = self._idle.pop(0)
                if replica.alive():
                    return replica
        return None

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
            booting, self._booting = self._booting, []
        for replica in idle + booting:
            stop_replica(replica)
