"""One owner per served entity: its ``ReplicaSet`` is the only code that changes the entity's replicas
and limits.

Rollouts (``endpoints.rollouts``) create a set, ``start`` its first replicas and ``configure`` it when a
config change keeps it; the autoscaler calls ``scale_to`` and ``set_limits``; the backend starts and
stops processes for it (``replicas.local_backend``); the data plane reads it through its dispatcher.
Everyone else reads ``replicas``, ``max_concurrency``, ``scaling`` and ``starting``.

``scale_to`` returns at once: new replicas start in the background (from the warm pool when there is
one). A lower count is taken from the replicas still starting first: a start that completes past the
count last asked for is stopped, not added; only the rest of the surplus leaves the routing at once (the
least busy ready replicas) and stops once its requests are answered. A dead replica leaves the routing when
``ready_count`` counts it or the dispatcher could not reach it (``lost``), and a replacement starts at once, as
a Kubernetes ReplicaSet replaces a pod that died; while it starts, the dispatcher holds requests for it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.autoscaler.config import ScalingConfig
from serving.replicas.local import LocalReplica, ReplicaStartError
from serving.replicas.local_backend import LocalBackend
from serving.traffic.batching import BatchPlan
from serving.traffic.dispatcher import Dispatcher, SendBatch
from serving.traffic.replica import Replica

log = logging.getLogger(__name__)

DEFAULT_MAX_CONCURRENCY = 32
DRAIN_POLL_S = 0.1


class ReplicaSet:
    """A served entity's replicas, their concurrency limit, its dispatcher and its scaling config."""

    def __init__(
        self,
        name: str,
        model_name: str,
        version: str,
        backend: LocalBackend | None = None,
        *,
        endpoint: str = "",
        replicas: Sequence[Replica] = (),
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        scaling: ScalingConfig | None = None,
        max_queue: int | None = None,
        drain_timeout_s: float = 30.0,
        on_change: Callable[[ReplicaSet], None] | None = None,
    ) -> None:
        self.endpoint = endpoint  # for its log lines ("endpoint/entity")
        self.name = name
        self.model_name = model_name
        self.version = version
        self.backend = backend  # None: replicas handed in (tests, fakes); no start or scale
        self.dispatcher: Dispatcher | None = None  # set by ``attach`` before traffic reaches the entity
        self.drain_timeout_s = drain_timeout_s
        self.wanted: int | None = None  # the count ``scale_to`` last asked for
        self._replicas: list[Replica] = list(replicas)
        self._max_concurrency = max_concurrency
        self._scaling = scaling
        # the gateway queue's bound from the start: the scaling config's (a follower's set, which no autoscaler
        # here moves, keeps it), else the dispatcher's default
        self._max_queue = max_queue if max_queue is not None else (scaling.max_queue if scaling is not None else None)
        self._starting = 0
        self._replacing = 0  # of ``_starting``: replacements of replicas that died
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._on_change = on_change  # told whenever ``replicas`` changes (the replica book records them)
        self.followed = False  # routing only, to replicas another gateway runs (``route_to``)

    # ---- what others read ----------------------------------------------------------------------
    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The replicas in the routing, in the order they joined."""
        return tuple(self._replicas)

    @property
    def max_concurrency(self) -> int:
        return self._max_concurrency

    @property
    def scaling(self) -> ScalingConfig | None:
        """The autoscaler's config for the entity (None: not autoscaled)."""
        return self._scaling

    @property
    def starting(self) -> int:
        """Replicas ``scale_to`` is starting, not yet in the routing."""
        return self._starting

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"

    # ---- limits --------------------------------------------------------------------------------
    def attach(self, send: SendBatch, timeout_s: float = 30.0) -> Dispatcher:
        """Give the entity its dispatcher: requests queue here and go to its replicas in batches."""
        self.dispatcher = Dispatcher(
            send, lambda: self._replicas, limit=lambda: self._max_concurrency, timeout_s=timeout_s
        )
        self.dispatcher.on_lost = self.lost
        self.dispatcher.replacing = lambda: self._replacing > 0
        if self._max_queue is not None:
            self.set_limits(max_queue=self._max_queue, queue_cap=self._max_queue)
        return self.dispatcher

    def configure(self, max_concurrency: int, scaling: ScalingConfig | None) -> None:
        """A config change that keeps this entity: its new limit applies at once, and its scaling config."""
        self._scaling = scaling
        self.set_limits(max_concurrency=max_concurrency)

    def ready_in_s(self) -> float:
        """Seconds a replica asked for now needs to serve, as the backend measured its last starts (0: unknown)."""
        return self.backend.ready_in_s() if self.backend is not None else 0.0

    def set_limits(
        self, *, max_concurrency: int | None = None, max_queue: int | None = None, queue_cap: int | None = None
    ) -> None:
        """The per-replica concurrency limit (what it lets go now is sent), the gateway queue's bound, and what
        the queue holds at most while a lost replica's replacement starts (``Dispatcher.queue_cap``)."""
        if max_queue is not None and self.dispatcher is not None:
            self.dispatcher.max_queue = max_queue
        if queue_cap is not None and self.dispatcher is not None:
            self.dispatcher.queue_cap = queue_cap
        if max_concurrency is not None:
            self._max_concurrency = max_concurrency
            if self.dispatcher is not None:
                self.dispatcher.capacity_changed()

    def _adopt_plan(self, ready: Mapping[str, Any] | None, *, replace: bool) -> None:
        """The batching plan from a replica's ready answer (the first one, unless ``replace``)."""
        if self.dispatcher is None or not isinstance(ready, Mapping) or not isinstance(ready.get("batching"), dict):
            return
        if replace or not self.dispatcher.plan.enabled:
            self.dispatcher.plan = BatchPlan.from_json(ready["batching"])

    # ---- replicas ------------------------------------------------------------------------------
    async def start(self, n: int, timeout_s: float) -> None:
        """A rollout's first ``n`` replicas, started cold and waited for; ReplicaStartError (or OSError)
        if one fails, and the caller then ``stop``s the set. Each process is in ``replicas`` from its
        spawn, so a cancelled rollout stops every one."""
        backend = self._backend()
        # the fork server's imports, the first time (seconds): in a thread, or the gateway answers nothing meanwhile
        await run_in_threadpool(backend.prepare)
        spawned: list[LocalReplica] = []
        for _ in range(n):  # spawned on the loop, not in a thread: a cancelled rollout must know every process
            spawned.append(backend.spawn(self.model_uri))
            self._replicas.append(spawned[-1])
        for replica in spawned:
            ready = await run_in_threadpool(backend.wait_ready, replica, timeout_s)
            self._adopt_plan(ready, replace=True)
        if self.dispatcher is not None:
            self.dispatcher.capacity_changed()
        self._changed()

    def adopt(self, replica: Replica, ready: Mapping[str, Any]) -> None:
        """A live replica of this entity that a previous gateway started (see ``replicas.local.adopt_replica``)."""
        self._replicas.append(replica)
        self._adopt_plan(ready, replace=len(self._replicas) == 1)
        if self.dispatcher is not None:
            self.dispatcher.capacity_changed()
        self._changed()

    def route_to(self, replicas: Sequence[Replica]) -> None:
        """A routing-only set (no backend): its replicas are now ``replicas`` (run elsewhere); those it had
        already, by address, are kept with their outstanding counts."""
        known = {r.url: r for r in self._replicas}
        fresh = [known.get(r.url, r) for r in replicas]
        if [r.url for r in fresh] != [r.url for r in self._replicas]:
            self._replicas = fresh
            if self.dispatcher is not None:
                self.dispatcher.capacity_changed()

    def detach(self) -> None:
        """Stop following where the replicas come from (a set of local or remote replicas follows nothing)."""

    def ready_count(self) -> int:
        """The replicas in the routing; a dead one leaves it here, and its replacement starts."""
        dead = [r for r in self._replicas if not r.alive()]
        for replica in dead:
            self._replicas.remove(replica)
            code = replica.process.returncode if isinstance(replica, LocalReplica) else None
            log.warning("replica %s of %s/%s died (code %s)", replica.id, self.endpoint, self.name, code)
        if dead:
            self._changed()
            if self.backend is not None and not self._closed:
                for _ in dead:
                    self._starting += 1
                    self._replacing += 1
                    self._spawn(self._add(replacing=True))
        return len(self._replicas)

    def lost(self, replica: Replica) -> None:
        """The dispatcher could not reach ``replica``: if its process is gone, it leaves the routing and its
        replacement starts now (one that still runs stays; the dispatcher skips it for a while)."""
        if replica in self._replicas:
            self.ready_count()

    def scale_to(self, n: int) -> None:
        """Ask for ``n`` replicas; returns at once (starts run in the background, see the module doc)."""
        self.wanted = n
        current = self.ready_count() + self._starting
        for _ in range(n - current):
            self._starting += 1
            self._spawn(self._add())
        # replicas still starting leave first, as a Kubernetes ReplicaSet deletes pending pods before ready
        # ones: ``_add`` stops each that comes up past the wanted count; only the rest of the surplus takes
        # ready replicas, the least busy first (a ready replica serves now, a starting one only later)
        surplus = current - n - self._starting
        if surplus > 0:
            leaving = sorted(self._replicas, key=lambda r: r.outstanding)[:surplus]
            for replica in leaving:
                self._replicas.remove(replica)  # no new requests from here on
                self._spawn(self._drain_and_stop(replica))
            if leaving:
                self._changed()

    async def stop(self, *, cancel_starts: bool = False) -> None:
        """Out of service: every replica stopped. A start under way stops its replica once it is up, or
        at once with ``cancel_starts`` (the gateway is stopping)."""
        self._closed = True
        if cancel_starts:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        replicas, self._replicas = self._replicas, []
        if self.backend is None:
            return  # routing only: the replicas are another gateway's
        self._changed()
        for replica in replicas:
            await self._backend().stop(replica)

    # ---- internals -----------------------------------------------------------------------------
    def _backend(self) -> LocalBackend:
        if self.backend is None:
            raise RuntimeError(f"replica set {self.endpoint}/{self.name} has no backend to start or stop replicas")
        return self.backend

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(self)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _add(self, *, replacing: bool = False) -> None:
        """One more replica: started, then in the routing, or stopped if it is no longer wanted. It counts
        as starting until then (and as ``replacing`` a dead one, when it does)."""
        try:
            replica, ready = await self._backend().start(self.model_uri)
            if self._closed:  # the entity left the routing meanwhile
                await self._backend().stop(replica)
            elif len(self._replicas) >= (self.wanted if self.wanted is not None else len(self._replicas) + 1):
                log.info(
                    "replica %s of %s/%s came up after a scale-down to %d: stopped",
                    replica.id,
                    self.endpoint,
                    self.name,
                    self.wanted,
                )
                await self._backend().stop(replica)
            else:
                self._replicas.append(replica)
                self._adopt_plan(ready, replace=False)
                if self.dispatcher is not None:
                    self.dispatcher.capacity_changed()
                self._changed()
                log.info(  # benchmarks/fidelity.py reads this line (ADDED)
                    "replica pid %d added to %s/%s (%d now)", replica.pid, self.endpoint, self.name, len(self._replicas)
                )
        except (ReplicaStartError, OSError) as exc:
            log.error("could not add a replica to %s/%s: %s", self.endpoint, self.name, exc)
        finally:
            self._starting = max(0, self._starting - 1)
            if replacing:
                self._replacing -= 1

    async def _drain_and_stop(self, replica: Replica) -> None:
        waited = 0.0
        while replica.outstanding > 0 and waited < self.drain_timeout_s:
            await asyncio.sleep(DRAIN_POLL_S)
            waited += DRAIN_POLL_S
        await self._backend().stop(replica)
