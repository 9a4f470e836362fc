"""Rollouts: an endpoint's config brought live on replica sets, and what serves each endpoint now.

A rollout starts the replicas of the config's new served entities (adopting the ones a previous gateway left
running), waits until they are ready, and only then moves traffic to them and stops the sets the config
dropped; a failed rollout ends ``UPDATE_FAILED`` and the old config keeps serving. An endpoint's rollouts run
one at a time, each from what the one before left live. Only the leader runs rollouts (``leading``); the
outcome is written to the store once the replica table lists the new replicas. The data plane looks its endpoints
up here (``served``): an endpoint being restored after a gateway restart is waited for, one being created is
a 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.live import LiveEndpoint
from serving.endpoints.placement import Placement
from serving.endpoints.scaling import scaling_config
from serving.endpoints.store import EndpointStore
from serving.protocol.errors import ApiError, not_found, unavailable
from serving.replicas.book import ReplicaBook
from serving.replicas.local import ReplicaStartError
from serving.replicas.replica_set import DEFAULT_MAX_CONCURRENCY, ReplicaSet
from serving.state.lease import Fence
from serving.state.replica_table import ReplicaRow

log = logging.getLogger(__name__)

OUTCOME_ATTEMPTS = 5  # reads and conditional writes of a rollout's outcome, each lost to a concurrent change

# replica rows a previous gateway left running, by (endpoint, served entity name, model URI)
LeftRunning = Mapping[tuple[str, str, str], list[ReplicaRow]]


def superseded(record: spec.EndpointRecord, version: int) -> bool:
    """The record waits for a config later than ``version`` (a change written while that rollout ran): its
    outcome is not the endpoint's. Ending the update there would say READY for a config nobody serves yet."""
    return (
        record.config_update == "IN_PROGRESS" and record.pending_config is not None and version <= record.config_version
    )


class Rollouts:
    def __init__(
        self,
        store: EndpointStore,
        placement: Placement,
        book: ReplicaBook,
        attach: Callable[[ReplicaSet], None],
        *,
        ready_timeout_s: float,
        request_timeout_s: float,
        fence: Fence | None = None,
    ) -> None:
        self.store = store
        self.placement = placement
        self.book = book
        self._attach = attach  # connects a new replica set to the replica client
        self._ready_timeout_s = ready_timeout_s
        self._request_timeout_s = request_timeout_s
        self.live: dict[str, LiveEndpoint] = {}
        # Several gateways on one store: only the leader runs rollouts, replicas and the autoscaler; the others
        # write their control-plane changes to the store (the leader picks them up) and route to its replicas.
        self.leading = True
        self.fence = fence  # the leader's fencing token, checked by its record writes
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # sets handed over by a gateway that stopped leading
        self._restoring: dict[str, asyncio.Event] = {}  # set once the restored endpoint is live (or failed)
        self._closing = False  # the gateway is stopping: a cancelled rollout leaves a cluster's Deployments be

    def running(self, name: str) -> bool:
        """A rollout of endpoint ``name`` runs (or waits for the one before it)."""
        return name in self._tasks

    def mark_restoring(self, name: str) -> None:
        """Endpoint ``name`` is being restored after a gateway restart: its requests wait for its next rollout."""
        self._restoring[name] = asyncio.Event()

    def spawn(self, name: str, config: spec.EndpointCoreConfig, version: int, left: LeftRunning | None = None) -> None:
        """Roll ``config`` out in the background. One rollout at a time per endpoint: one asked for while another
        runs (a change sent while a new leader adopts what it found) waits for it and starts from what it left
        live. Two at once would each stop only the sets live when it began, so the sets of the one that ended
        first would keep running unlisted, and the last to end would decide what serves."""
        previous = self._tasks.get(name)
        task = asyncio.get_running_loop().create_task(self._deploy(name, config, version, left, previous))
        self._tasks[name] = task

        def done(ended: asyncio.Task[None]) -> None:
            if self._tasks.get(name) is ended:  # not a later rollout that replaced it meanwhile
                del self._tasks[name]

        task.add_done_callback(done)

    async def cancel(self, name: str) -> None:
        """Cancel endpoint ``name``'s rollout and stop what serves it (the endpoint was deleted)."""
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its replicas are stopped before this returns
        live = self.live.pop(name, None)
        if live is not None:
            await self.stop_all(live.replica_sets.values())

    async def stop(self, *, stop_replicas: bool) -> None:
        """The gateway stops: rollouts cancelled, nothing routed any more, and the replica sets stopped if
        ``stop_replicas`` (else the next leader adopts their replicas)."""
        self._closing = True
        rollouts = list(self._tasks.values())
        for task in rollouts:
            task.cancel()
        # wait for each cancelled rollout to stop the replicas it started: the loop ends after this returns,
        # and a rollout never resumed would leave a replica still loading its model behind (an orphan)
        await asyncio.gather(*rollouts, return_exceptions=True)
        replica_sets = [s for live in self.live.values() for s in live.replica_sets.values()]
        self.live.clear()
        if stop_replicas:
            await self.stop_all(replica_sets, cancel_starts=True)

    async def wait_settled(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def served(self, name: str) -> LiveEndpoint:
        """The live endpoint; one being restored after a gateway restart is waited for (up to the request
        timeout), one being created is a 503 at once, as Databricks answers for an endpoint not ready."""
        live = self.live.get(name)
        if live is not None:
            return live
        restoring = self._restoring.get(name)
        if restoring is not None:
            try:
                await asyncio.wait_for(restoring.wait(), self._request_timeout_s)
            except TimeoutError:
                raise unavailable(f"endpoint {name} is still starting after a gateway restart; retry shortly") from None
            live = self.live.get(name)
            if live is not None:
                return live
        if name in self._tasks or restoring is not None:
            raise unavailable(f"endpoint {name} is not ready yet")
        raise not_found(f"endpoint {name} does not exist")

    def spawn_stop(self, replica_sets: Iterable[ReplicaSet]) -> None:
        """Stop ``replica_sets`` in the background, each replica once its requests are answered."""
        task = asyncio.get_running_loop().create_task(self.stop_all(list(replica_sets)))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def stop_all(self, replica_sets: Iterable[ReplicaSet], *, cancel_starts: bool = False) -> None:
        for replica_set in replica_sets:
            await replica_set.stop(cancel_starts=cancel_starts)

    async def _deploy(
        self,
        name: str,
        config: spec.EndpointCoreConfig,
        version: int,
        left: LeftRunning | None = None,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        try:
            if after is not None:  # cancelled with this one (a delete, a shutdown)
                await asyncio.gather(after, return_exceptions=True)
            await self._roll_out(name, config, version, left or {})
        finally:
            restoring = self._restoring.pop(name, None)
            if restoring is not None:
                restoring.set()  # requests waiting for the restored endpoint go on (or get 503 if it failed)

    async def _roll_out(self, name: str, config: spec.EndpointCoreConfig, version: int, left: LeftRunning) -> None:
        old = self.live.get(name)
        keep: dict[str, ReplicaSet] = {}
        started: list[ReplicaSet] = []
        try:
            for served_entity in spec.registry_entities(config):
                current = old.replica_sets.get(str(served_entity.name)) if old else None
                if current is not None and _serves(current, served_entity):
                    limit = served_entity.max_concurrency or DEFAULT_MAX_CONCURRENCY
                    current.configure(limit, scaling_config(served_entity, stored=True))  # applies at once
                    keep[str(served_entity.name)] = current
                    continue
                replica_set = self.placement.run(name, served_entity)
                self._attach(replica_set)
                started.append(replica_set)
                keep[str(served_entity.name)] = await self._start(name, served_entity, replica_set, left)
        except (ReplicaStartError, OSError) as exc:
            log.error("rollout of endpoint %s failed: %s", name, exc)
            await self.stop_all(started)
            await self._finish(name, version, ready=old is not None, update="UPDATE_FAILED", message=str(exc)[:500])
            return
        except asyncio.CancelledError:
            await self.stop_all(started, cancel_starts=self._closing)
            raise
        self.live[name] = LiveEndpoint.of(keep, config)
        if old is not None:
            await self.stop_all([s for n, s in old.replica_sets.items() if keep.get(n) is not s])
        await self._finish(name, version, ready=True, update="NOT_UPDATING", config=config)

    async def _start(
        self, name: str, served_entity: spec.ServedEntityInput, replica_set: ReplicaSet, left: LeftRunning
    ) -> ReplicaSet:
        """``replica_set`` with its first replicas: the ones left running that it adopts, then new ones up to
        the served entity's minimum (at least one), ready."""
        rows = left.get((name, str(served_entity.name), replica_set.model_uri), [])
        adopted = await self.book.adopt(replica_set, rows)
        missing = max(served_entity.min_replicas or 1, 1) - adopted
        if missing > 0:
            await replica_set.start(missing, self._ready_timeout_s)
        return replica_set

    async def _finish(
        self,
        name: str,
        version: int,
        *,
        ready: bool,
        update: str,
        message: str | None = None,
        config: spec.EndpointCoreConfig | None = None,
    ) -> None:
        """Write the outcome of the rollout of config ``version`` (``config`` once it serves). Only once the
        replica table lists its replicas: a follower that reads READY routes to them at once. Nothing when a change
        written since waits for a later version (:func:`superseded`): that rollout writes the outcome.

        The write is conditional on the record read (its revision), so a change another gateway wrote meanwhile
        is never overwritten: the record is read again and the check made again. It is fenced: a gateway whose
        leader lease another has taken writes nothing (StaleLeader)."""
        await self.book.flush()
        for _ in range(OUTCOME_ATTEMPTS):
            try:
                record = await run_in_threadpool(self.store.get, name)
            except Exception:
                return  # deleted meanwhile
            if superseded(record, version):
                return
            expected = record.config_version
            record.ready = "READY" if ready else "NOT_READY"
            record.config_update = update
            record.pending_config = None
            record.state_message = message
            record.updated_ms = int(time.time() * 1000)
            if config is not None:
                record.config, record.config_version = config, version
            try:
                await run_in_threadpool(self.store.compare_and_set, name, expected, record, self.fence)
                return
            except ApiError as exc:
                if exc.status_code != 409:
                    raise
        log.warning(
            "endpoint %s: the outcome of config %d lost %d races in a row; not written", name, version, OUTCOME_ATTEMPTS
        )


def _serves(replica_set: ReplicaSet, served_entity: spec.ServedEntityInput) -> bool:
    """``replica_set`` is this gateway's own and already runs ``served_entity``'s model version: the new
    config keeps it, reconfigured in place."""
    return not replica_set.followed and (replica_set.model_name, replica_set.version) == (
        served_entity.entity_name,
        served_entity.resolved_version,
    )
