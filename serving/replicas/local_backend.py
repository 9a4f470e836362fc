"""The embedded backend: it starts and stops local replica processes for the replica sets
(``replicas.replica_set``), which decide how many each entity has.

A start takes a standby from the warm pool when it has one (only the model load remains) and starts a
new process otherwise, forked from the launcher's fork server (``replicas.forking``); either way it returns
a replica that answered ready, or stops what it started and raises. The pool refills itself in the background
after every start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.replicas.local import Launcher, LocalReplica, ReplicaStartError, stop_replica, wait_ready
from serving.replicas.warm_pool import WarmPool
from serving.traffic.replica import Replica

log = logging.getLogger(__name__)


class LocalBackend:
    def __init__(self, launcher: Launcher, pool: WarmPool | None = None) -> None:
        self.launcher = launcher
        self.pool = pool
        self.cold_starts = 0
        self.warm_starts = 0
        self.warm_start_s = 0.0  # how long the last start from a standby took to answer ready (0: none yet)
        self.cold_start_s = 0.0  # ... and the last start of a new process

    def ready_in_s(self) -> float:
        """Seconds a replica asked for now needs to answer ready: the last warm start's while a standby is idle,
        else the last cold start's (the other when only one was measured; 0 before any)."""
        warm = self.pool is not None and self.pool.idle > 0
        first, second = (self.warm_start_s, self.cold_start_s) if warm else (self.cold_start_s, self.warm_start_s)
        return first or second

    def prepare(self) -> None:
        """What a start needs before it spawns: the fork server up with its imports done. Blocking, seconds
        the first time (run it off the event loop); at once after that."""
        self.launcher.prepare()

    def spawn(self, model_uri: str) -> LocalReplica:
        """A new replica process for ``model_uri``; returns at once (see ``wait_ready``)."""
        return self.launcher.start(model_uri)

    def wait_ready(self, replica: LocalReplica, timeout_s: float) -> dict[str, Any]:
        """Block until ``replica`` answers ready; its ready answer (with its batching plan)."""
        return wait_ready(replica, timeout_s)

    async def start(self, model_uri: str) -> tuple[LocalReplica, dict[str, Any]]:
        """A replica of ``model_uri`` that answered ready, and its ready answer. On a failure (or a
        cancel: the gateway stopping) the process it started is stopped and the error raised."""
        replica: LocalReplica | None = None
        began = time.monotonic()
        try:
            replica = self.pool.take() if self.pool is not None else None
            if replica is not None:
                ready = await run_in_threadpool(self.launcher.activate, replica, model_uri)
                self.warm_starts += 1
                self.warm_start_s = time.monotonic() - began
            else:
                await run_in_threadpool(self.prepare)  # the fork server's imports, the first time
                # started here, not in a thread: a cancelled start must always know its process, to stop it
                replica = self.spawn(model_uri)
                ready = await run_in_threadpool(wait_ready, replica)
                self.cold_starts += 1
                self.cold_start_s = time.monotonic() - began
        except (ReplicaStartError, OSError):
            if replica is not None:
                await run_in_threadpool(stop_replica, replica)
            self.refill()
            raise
        except asyncio.CancelledError:
            if replica is not None:  # the gateway is stopping while it starts: it must not outlive the gateway
                stop_replica(replica)
            raise
        self.refill()
        return replica, ready

    async def stop(self, replica: Replica) -> None:
        """Stop one of the processes this backend started (a replica set holds only those when it has a backend)."""
        if not isinstance(replica, LocalReplica):
            raise TypeError(f"the local backend stops only the processes it started, not replica {replica.id}")
        await run_in_threadpool(stop_replica, replica)

    def refill(self) -> None:
        """Top the warm pool up in the background (a fill that runs already does it)."""
        if self.pool is not None:
            asyncio.get_running_loop().run_in_executor(None, self.pool.fill)

    async def close(self) -> None:
        if self.pool is not None:
            await run_in_threadpool(self.pool.close)
