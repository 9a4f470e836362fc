"""The embedded backend: a served entity's replicas are local processes of the gateway's host.

``set_replicas`` is called by the controller on the gateway's event loop and returns at once: new
replicas start in the background (from the warm pool when it has one: only the model load remains),
surplus ones leave the routing at once and stop once their requests are answered. A count lowered
while replicas are still starting holds for them too: a start that completes past the count last asked
for is stopped, not added (a scale-down during a slow start does not leave the extra replica behind).
Dead replicas are dropped from the routing when counted, so the controller sees them missing and
replaces them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.replicas.local import Launcher, LocalReplica, ReplicaStartError, stop_replica, wait_ready
from serving.replicas.served_entity import ServedEntity
from serving.replicas.warm_pool import WarmPool
from serving.traffic.batching import BatchPlan

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.1


Lookup = Callable[[str, str], "ServedEntity | None"]   # (endpoint, entity) -> the live entity, or None


class LocalBackend:
    def __init__(self, entities: Lookup, launcher: Launcher, pool: WarmPool | None = None, *,
                 drain_timeout_s: float = 30.0) -> None:
        self.entities = entities
        self.launcher = launcher
        self.pool = pool
        self.drain_timeout_s = drain_timeout_s
        self.starting: dict[tuple[str, str], int] = {}
        self.wanted: dict[tuple[str, str], int] = {}   # the count last asked for, per entity
        self.cold_starts = 0
        self.warm_starts = 0
        self._tasks: set[asyncio.Task[Any]] = set()

    def _entity(self, endpoint: str, entity: str) -> ServedEntity:
        served = self.entities(endpoint, entity)
        if served is None:
            raise LookupError(f"served entity {endpoint}/{entity} is not live")
        return served

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        served = self._entity(endpoint, entity)
        dead = [r for r in served.replicas if not r.alive()]
        for replica in dead:  # a crashed replica: out of the routing; the controller replaces it
            served.replicas.remove(replica)
            log.warning("replica pid %d of %s/%s died (code %s)", replica.pid, endpoint, entity, replica.process.returncode)
        return len(served.replicas)

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        served = self._entity(endpoint, entity)
        key = (endpoint, entity)
        self.wanted[key] = n
        current = self.ready_replicas(endpoint, entity) + self.starting.get(key, 0)
        for _ in range(n - current):
            self.starting[key] = self.starting.get(key, 0) + 1
            self._spawn(self._add(key, served))
        surplus = current - n
        if surplus > 0:
            # ready replicas leave first; what is left of the surplus is still starting, and ``_add``
            # stops those when they come up past the wanted count
            victims = sorted(served.replicas, key=lambda r: r.outstanding)[:surplus]
            for replica in victims:
                served.replicas.remove(replica)  # no new requests from here on
                self._spawn(self._drain_and_stop(replica))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add(self, key: tuple[str, str], served: ServedEntity) -> None:
        replica: LocalReplica | None = None
        try:
            replica = self.pool.take() if self.pool is not None else None
            if replica is not None:
                ready = await run_in_threadpool(self.launcher.activate, replica, served.model_uri)
                self.warm_starts += 1
            else:
                # spawned here, not in a thread: a cancelled task must always know its process, to stop it
                replica = self.launcher.start(served.model_uri)
                ready = await run_in_threadpool(wait_ready, replica)
                self.cold_starts += 1
            if self.entities(*key) is not served:  # the entity went away meanwhile
                await run_in_threadpool(stop_replica, replica)
                return
            if len(served.replicas) >= self.wanted.get(key, len(served.replicas) + 1):
                log.info("replica pid %d of %s/%s came up after a scale-down to %d: stopped", replica.pid,
                         key[0], key[1], self.wanted[key])
                await run_in_threadpool(stop_replica, replica)
                return
            served.replicas.append(replica)
            if served.dispatcher is not None:
                if isinstance(ready, dict) and isinstance(ready.get("batching"), dict) and not served.dispatcher.plan.enabled:
                    served.dispatcher.plan = BatchPlan.from_json(ready["batching"])
                served.dispatcher.capacity_changed()
            log.info("replica pid %d added to %s/%s (%d now)", replica.pid, key[0], key[1], len(served.replicas))
        except (ReplicaStartError, OSError) as exc:
            log.error("could not add a replica to %s/%s: %s", key[0], key[1], exc)
            if replica is not None:
                await run_in_threadpool(stop_replica, replica)
        except asyncio.CancelledError:
            # the gateway is stopping while this replica starts: it must not outlive the gateway
            if replica is not None and replica not in served.replicas:
                stop_replica(replica)
            raise
        finally:
            self.starting[key] = max(0, self.starting.get(key, 1) - 1)
            if self.pool is not None:
                self._spawn(run_in_threadpool(self.pool.fill))

    async def _drain_and_stop(self, replica: LocalReplica) -> None:
        waited = 0.0
        while replica.outstanding > 0 and waited < self.drain_timeout_s:
            await asyncio.sleep(DRAIN_POLL_S)
            waited += DRAIN_POLL_S
        await run_in_threadpool(stop_replica, replica)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.pool is not None:
            await run_in_threadpool(self.pool.close)
