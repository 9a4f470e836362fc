"""The warm pool: standby replica processes with the runtime already imported, waiting for a model.

A scale-up (or a scale from zero) takes one and loads its model into it (``serving.replicas.local.activate``),
so a cold start costs the model load only, not the interpreter start and the imports (several seconds
here). The pool refills itself in the background after every take, one standby at a time.
"""

from __future__ import annotations

import logging
import threading

from serving.replicas.local import Launcher, LocalReplica, ReplicaStartError, stop_replica, wait_live

log = logging.getLogger(__name__)


class WarmPool:
    def __init__(self, size: int, launcher: Launcher) -> None:
        if size < 0:
            raise ValueError("warm pool size must be >= 0")
        self.size = size
        self._launcher = launcher
        self._idle: list[LocalReplica] = []
        self._booting: list[LocalReplica] = []  # started, not yet live: close() stops these too
        self._lock = threading.Lock()
        self._filling = threading.Lock()  # held by the one fill that runs
        self._closed = False

    @property
    def idle(self) -> int:
        with self._lock:
            return sum(r.alive() for r in self._idle)

    def fill(self) -> None:
        """Start standby processes until ``size`` are idle (blocking; run it off the loop).

        One at a time: a refill runs right after a scale-up took standbys, while the replicas they became
        serve the load that asked for them, and several interpreters importing the runtime at once take
        the cores from those replicas (on 2 cores, three standbys started together kept both busy for
        ~30 s of a 10x step). A call while a fill runs returns at once: the running fill checks the pool
        again after each start, and once more after it ends.
        """
        while True:
            if not self._filling.acquire(blocking=False):
                return
            try:
                started = self._fill_one_at_a_time()
            finally:
                self._filling.release()
            if not started:  # a start failed: the next take retries, not this loop
                return
            with self._lock:  # a take between the last check and the release
                if self._closed or sum(r.alive() for r in self._idle) >= self.size:
                    return

    def _fill_one_at_a_time(self) -> bool:
        """Start standbys until the pool is full or closed (True), or until one fails to start (False)."""
        while True:
            with self._lock:
                self._idle = [r for r in self._idle if r.alive()]
                if self._closed or len(self._idle) >= self.size:
                    return True
            try:
                replica = self._launcher.start("")
            except OSError as exc:
                log.warning("warm pool: could not start a standby replica: %s", exc)
                return False
            with self._lock:
                self._booting.append(replica)
            try:
                wait_live(replica)
            except ReplicaStartError as exc:
                log.warning("warm pool: a standby replica failed to start: %s", exc)
                stop_replica(replica)
                return False
            finally:
                with self._lock:
                    if replica in self._booting:
                        self._booting.remove(replica)
            with self._lock:
                closed = self._closed
                if not closed:
                    self._idle.append(replica)
            if closed:  # the gateway stopped while it started
                stop_replica(replica)
                return True

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
