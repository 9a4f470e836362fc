"""A served entity whose replicas are the pods of one Deployment: its count is declared to the cluster, its
routing follows the EndpointSlice watch (``routes``).

Each pod's readiness answer carries the batching plan its replica measured of the model (as a local replica's
does at start): the set reads it from the first pod it routes to, so requests are batched as they are for local
replicas.

The leader's set declares: ``start`` creates (or adopts) the Deployment and waits for ready pods,
``scale_to`` patches the scale subresource, ``stop`` deletes the Deployment (the cluster drains the pods:
a stopping pod leaves the slices before its SIGTERM, the template's ``preStop``). A follower's set, or any
set once its gateway is shutting down, only routes: the Deployment belongs to the cluster and outlives
every gateway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import httpx
from starlette.concurrency import run_in_threadpool

from serving.replicas.cluster.api import ClusterError, DeploymentApi
from serving.replicas.cluster.objects import Wanted
from serving.replicas.cluster.routes import PodReplica, Routes
from serving.replicas.local import ReplicaStartError
from serving.replicas.replica_set import ReplicaSet
from serving.traffic.replica import Replica

log = logging.getLogger(__name__)

READY_POLL_S = 0.2
PLAN_TIMEOUT_S = 2.0


class PodSet(ReplicaSet):
    def __init__(
        self,
        wanted: Wanted,
        model_name: str,
        version: str,
        routes: Routes,
        deployments: DeploymentApi | None,
        **options: Any,
    ) -> None:
        super().__init__(wanted.entity, model_name, version, None, endpoint=wanted.endpoint, **options)
        self.wanted_objects = wanted
        self.object_name = wanted.name
        self.deployments = deployments  # None: routing only (a follower)
        self.followed = deployments is None
        self._routes = routes
        self._loop = asyncio.get_running_loop()
        self._plan_read = False
        self._asked: list[float] = []  # when each pod asked for and not yet routed was asked for, oldest first
        self._pod_start_s = 0.0  # how long the last such pod took from the ask to the routing (0: none yet)
        routes.subscribe(self.object_name, self._from_watch)

    def _from_watch(self, pods: list[PodReplica]) -> None:
        """Called on the watch's thread (or the loop's, at subscription): the routing changes on the loop."""
        try:
            self._loop.call_soon_threadsafe(self.route_to, pods)
        except RuntimeError:  # the loop is closed: the gateway has stopped
            pass

    def route_to(self, replicas: Sequence[Replica]) -> None:
        now, before = time.monotonic(), len(self._replicas)
        super().route_to(replicas)
        for _ in range(min(len(self._asked), max(0, len(self._replicas) - before))):
            self._pod_start_s = now - self._asked.pop(0)
        if replicas and not self._plan_read and self.dispatcher is not None:
            self._plan_read = True
            self._spawn(self._read_plan(replicas[0]))

    async def _read_plan(self, pod: Replica) -> None:
        """The batching plan from ``pod``'s ready answer; none (no batching) if it does not give one."""
        try:
            async with httpx.AsyncClient(timeout=PLAN_TIMEOUT_S) as client:
                answer = await client.get(f"{pod.url}/health/ready")
            if answer.status_code == 200:
                self._adopt_plan(answer.json(), replace=True)
                return
        except (httpx.HTTPError, ValueError):
            pass
        self._plan_read = False  # the next routing change asks the next pod

    def detach(self) -> None:
        """Stop following the watch; the routing stays as it is."""
        self._routes.unsubscribe(self.object_name, self._from_watch)

    @property
    def starting(self) -> int:
        """Pods asked for that are not ready yet."""
        return max(0, (self.wanted or 0) - len(self._replicas)) if self.deployments is not None else 0

    def ready_count(self) -> int:
        return len(self._replicas)

    def ready_in_s(self) -> float:
        """Seconds a pod asked for now needs to be routed, as the last scale-up's pods took (0: none measured)."""
        return self._pod_start_s

    async def start(self, n: int, timeout_s: float) -> None:
        """Create (or adopt) the Deployment with at least ``n`` pods and wait until ``n`` are ready and routed;
        ReplicaStartError if they are not within ``timeout_s``."""
        deployments = self._deployments()
        try:
            self.wanted = await run_in_threadpool(deployments.apply, self.wanted_objects, n)
        except ClusterError as exc:
            raise ReplicaStartError(str(exc)) from exc
        deadline = time.monotonic() + timeout_s
        while len(self._replicas) < n:
            if time.monotonic() > deadline:
                raise ReplicaStartError(
                    f"{len(self._replicas)} of {n} pod(s) of Deployment {self.object_name} ready "
                    f"after {timeout_s:.0f}s; see kubectl describe deployment {self.object_name}"
                )
            await asyncio.sleep(READY_POLL_S)
        if self.dispatcher is not None:
            self.dispatcher.capacity_changed()

    def scale_to(self, n: int) -> None:
        """Declare ``n`` pods; returns at once (the patch runs in the background, the watch brings the pods)."""
        if n == self.wanted:
            return
        now = time.monotonic()
        more = n - max(self.wanted or 0, len(self._replicas))
        self._asked = self._asked[: max(0, n - len(self._replicas))] + [now] * max(0, more)
        self.wanted = n
        self._spawn(self._scale(n))

    async def stop(self, *, cancel_starts: bool = False) -> None:
        """Out of the routing; the leader's set (not ``cancel_starts``: the gateway itself is not stopping)
        also deletes the Deployment."""
        self._closed = True
        self.detach()
        self._replicas = []
        for task in list(self._tasks):
            task.cancel()
        if self.deployments is not None and not cancel_starts:
            try:
                await run_in_threadpool(self.deployments.delete, self.object_name)
            except ClusterError as exc:
                log.error("%s: the leader's next start removes it (it is no endpoint's)", exc)

    def _deployments(self) -> DeploymentApi:
        if self.deployments is None:
            raise RuntimeError(
                f"{self.endpoint}/{self.name} routes to another gateway's Deployment: it cannot change it"
            )
        return self.deployments

    async def _scale(self, n: int) -> None:
        try:
            await run_in_threadpool(self._deployments().scale, self.object_name, n)
            log.info("Deployment %s of %s/%s scaled to %d", self.object_name, self.endpoint, self.name, n)
        except ClusterError as exc:
            log.error("%s", exc)
            self.wanted = None  # the next step asks again
