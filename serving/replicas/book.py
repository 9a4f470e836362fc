"""The gateway's side of the state store's replica table (``serving.state.replica_table``): it records each
served entity's local replica processes whenever they change, lists them for the followers, finds the replicas
a dead gateway left running, adopts the live ones and stops the rest. Used by the endpoint manager; the pid
checks assume the local backend (one machine).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Collection

from starlette.concurrency import run_in_threadpool

from serving.replicas.local import Launcher, LocalReplica, ReplicaOwned, adopt_replica, process_running, stop_stray
from serving.replicas.replica_set import ReplicaSet
from serving.state.replica_table import ReplicaRow, ReplicaTable

log = logging.getLogger(__name__)

ReplicaSetKey = tuple[str, str, str]  # (endpoint, served entity, model URI)


class ReplicaBook:
    def __init__(self, table: ReplicaTable, launcher: Launcher) -> None:
        self.table = table
        self.launcher = launcher
        self._recording: dict[ReplicaSetKey, asyncio.Lock] = {}  # one table write at a time per entity
        self._record_tasks: set[asyncio.Task[None]] = set()

    async def routes(self) -> dict[ReplicaSetKey, list[ReplicaRow]]:
        """Every replica in the table, by entity (what a follower routes to)."""
        rows: dict[ReplicaSetKey, list[ReplicaRow]] = {}
        for row in await run_in_threadpool(self.table.all):
            rows.setdefault(row.key, []).append(row)
        return rows

    async def flush(self) -> None:
        """Wait for the table writes under way."""
        await asyncio.gather(*self._record_tasks, return_exceptions=True)

    async def left_running(self, wanted: Collection[ReplicaSetKey]) -> dict[ReplicaSetKey, list[ReplicaRow]]:
        """The table's replicas whose gateway is gone: those of the ``wanted`` entities (the stored endpoints',
        ``serving.endpoints.placement.served_keys``), by entity, to adopt; those of anything else (an endpoint
        deleted or changed meanwhile) are stopped and forgotten."""
        try:
            rows = await run_in_threadpool(self.table.all)
        except Exception as exc:
            log.warning("replica table unreadable (%s): no replica adopted", type(exc).__name__)
            return {}
        by_entity: dict[ReplicaSetKey, list[ReplicaRow]] = {}
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
            await self._forget(strays)
        return by_entity

    async def adopt(self, replica_set: ReplicaSet, rows: list[ReplicaRow]) -> int:
        """Adopt the live replicas among ``rows`` into ``replica_set``; dead or foreign ones are stopped. How many."""
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
            replica_set.adopt(replica, ready)  # its row is rewritten under this gateway
            adopted += 1
        if gone:
            await self._forget(gone)
        return adopted

    def changed(self, replica_set: ReplicaSet) -> None:
        """Record the entity's replicas in the table (in the background; the newest list wins)."""
        task = asyncio.get_running_loop().create_task(self._record(replica_set))
        self._record_tasks.add(task)
        task.add_done_callback(self._record_tasks.discard)

    async def _forget(self, rows: list[ReplicaRow]) -> None:
        try:
            await run_in_threadpool(self.table.forget, rows)
        except Exception as exc:
            log.warning("replica table not updated: %s", type(exc).__name__)

    async def _record(self, replica_set: ReplicaSet) -> None:
        endpoint, entity, model_uri = replica_set.endpoint, replica_set.name, replica_set.model_uri
        async with self._recording.setdefault((endpoint, entity, model_uri), asyncio.Lock()):
            rows = [
                ReplicaRow(
                    replica_id=r.id,
                    host=r.host,
                    port=r.port,
                    pid=r.pid,
                    endpoint=endpoint,
                    entity=entity,
                    model_uri=model_uri,
                    backend="local",
                    started_at=r.started_at,
                    owner_pid=os.getpid(),
                )
                for r in replica_set.replicas
                if isinstance(r, LocalReplica)  # a set with the local backend holds only these
            ]
            try:
                await run_in_threadpool(self.table.replace, endpoint, entity, model_uri, os.getpid(), rows)
            except Exception as exc:
                log.warning("replica table not updated for %s/%s: %s", endpoint, entity, type(exc).__name__)
