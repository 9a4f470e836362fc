"""The gateway's side of the replica registry (``serving.state.replica_registry``): it records each served
entity's replicas whenever they change, finds the replicas a dead gateway left running, adopts the live ones
and stops the rest. Used by the endpoint manager; the pid checks assume the local backend (one machine).
"""

from __future__ import annotations

import asyncio
import logging
import os

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.replicas.local import Launcher, ReplicaOwned, adopt_replica, process_running, stop_stray
from serving.replicas.replica_set import ReplicaSet
from serving.state.replica_registry import ReplicaRegistry, ReplicaRow

log = logging.getLogger(__name__)

EntityKey = tuple[str, str, str]  # (endpoint, served entity, model URI)


class ReplicaBook:
    def __init__(self, registry: ReplicaRegistry, launcher: Launcher) -> None:
        self.registry = registry
        self.launcher = launcher
        self._recording: dict[EntityKey, asyncio.Lock] = {}  # one registry write at a time per entity
        self._record_tasks: set[asyncio.Task[None]] = set()

    async def routes(self) -> dict[EntityKey, list[ReplicaRow]]:
        """Every registered replica, by entity (what a follower routes to)."""
        rows: dict[EntityKey, list[ReplicaRow]] = {}
        for row in await run_in_threadpool(self.registry.all):
            rows.setdefault(row.key, []).append(row)
        return rows

    async def flush(self) -> None:
        """Wait for the registry writes under way."""
        await asyncio.gather(*self._record_tasks, return_exceptions=True)

    async def left_running(self, records: list[spec.EndpointRecord]) -> dict[tuple[str, str, str], list[ReplicaRow]]:
        """The registry's replicas whose gateway is gone: those of the stored endpoints' entities, by entity, to
        adopt; those of anything else (an endpoint deleted or changed meanwhile) are stopped and forgotten."""
        try:
            rows = await run_in_threadpool(self.registry.all)
        except Exception as exc:
            log.warning("replica registry unreadable (%s): no replica adopted", type(exc).__name__)
            return {}
        wanted = {
            (r.name, str(e.name), f"models:/{e.entity_name}/{e.resolved_version}")
            for r in records
            for e in spec.registry_entities(r.config)
        }
        by_entity: dict[tuple[str, str, str], list[ReplicaRow]] = {}
        strays = []
        for row in rows:
            if row.owner_pid != os.getpid() and process_running(row.owner_pid):
                continue  # another gateway on this state runs it: not ours to adopt or stop
            if row.key in wanted and row.backend == "local":
                by_entity.setdefault(row.key, []).append(row)
            else:
                strays.append(row)
        for row in strays:
            await run_in_threadpool(stop_stray, row.pid, row.port)
        if strays:
            log.info("stopped %d replica(s) left running that no endpoint needs", len(strays))
            try:
                await run_in_threadpool(self.registry.forget, strays)
            except Exception as exc:
                log.warning("replica registry not updated: %s", type(exc).__name__)
        return by_entity

    async def adopt(self, served: ReplicaSet, rows: list[ReplicaRow]) -> int:
        """Adopt the live replicas among ``rows`` into ``served``; dead or foreign ones are stopped. How many."""
        adopted = 0
        gone = []
        for row in rows:
            try:
                taken = await run_in_threadpool(
                    adopt_replica,
                    row.host,
                    row.port,
                    row.pid,
                    row.model_uri,
                    self.launcher.token,
                    self.launcher.log_dir,
                )
            except ReplicaOwned as exc:
                log.info("not adopted: %s", exc)
                continue
            if taken is None:
                await run_in_threadpool(stop_stray, row.pid, row.port)
                gone.append(row)
                continue
            replica, ready = taken
            replica.started_at = row.started_at
            served.adopt(replica, ready)  # its row is rewritten under this gateway
            adopted += 1
        if gone:
            try:
                await run_in_threadpool(self.registry.forget, gone)
            except Exception as exc:
                log.warning("replica registry not updated: %s", type(exc).__name__)
        return adopted

    def changed(self, served: ReplicaSet) -> None:
        """Record the entity's replicas in the registry (in the background; the newest list wins)."""
        task = asyncio.get_running_loop().create_task(self._record(served))
        self._record_tasks.add(task)
        task.add_done_callback(self._record_tasks.discard)

    async def _record(self, served: ReplicaSet) -> None:
        key = (served.endpoint, served.name, served.model_uri)
        async with self._recording.setdefault(key, asyncio.Lock()):
            rows = [
                ReplicaRow(
                    host=r.host,
                    port=r.port,
                    pid=r.pid,
                    endpoint=served.endpoint,
                    entity=served.name,
                    model_uri=served.model_uri,
                    backend="local",
                    started_at=r.started_at,
                    owner_pid=os.getpid(),
                )
                for r in served.replicas
            ]
            try:
                await run_in_threadpool(self.registry.replace, *key, os.getpid(), rows)
            except Exception as exc:
                log.warning(
                    "replica registry not updated for %s/%s: %s", served.endpoint, served.name, type(exc).__name__
                )
