"""Where a served entity's replicas run, as the endpoint manager asks for them: local processes (the embedded
backend, listed in the state store's replica table) or the pods of one Deployment on Kubernetes (``TOLLFREE_BACKEND=
kubernetes``, ``serving.replicas.cluster``). Either way the manager gets a ``ReplicaSet``: one it runs (the
leader's) or one that only routes (a follower's).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.scaling import scaling_config
from serving.replicas.replica_set import DEFAULT_MAX_CONCURRENCY, ReplicaSet

if TYPE_CHECKING:
    from serving.replicas.book import ReplicaBook, ReplicaSetKey
    from serving.replicas.cluster.connect import Cluster
    from serving.replicas.local_backend import LocalBackend

log = logging.getLogger(__name__)


class Placement:
    def __init__(self, backend: LocalBackend, book: ReplicaBook, cluster: Cluster | None = None) -> None:
        self.backend = backend
        self.book = book
        self.cluster = cluster

    def run(self, endpoint: str, entity: spec.ServedEntityInput) -> ReplicaSet:
        """The leader's set for ``entity``: it starts, scales and stops the replicas."""
        if self.cluster is not None:
            return self._pods(endpoint, entity, lead=True)
        return ReplicaSet(
            str(entity.name),
            _model_name(entity),
            str(entity.resolved_version),
            self.backend,
            endpoint=endpoint,
            max_concurrency=_limit(entity),
            scaling=scaling_config(entity, stored=True),
            on_change=self.book.changed,
        )

    def follow(self, endpoint: str, entity: spec.ServedEntityInput) -> ReplicaSet:
        """A follower's set for ``entity``: it routes to the replicas the leader runs (``Reconciler.follow`` gives a
        local one its replicas from the replica table; a cluster's follows the EndpointSlices by itself). Its queue
        holds what the leader's holds (the entity's ``max_queue``): while the leader replaces a replica, a follower's
        requests wait for the replacement as the leader's do."""
        if self.cluster is not None:
            return self._pods(endpoint, entity, lead=False)
        replica_set = ReplicaSet(
            str(entity.name),
            _model_name(entity),
            str(entity.resolved_version),
            None,
            endpoint=endpoint,
            max_concurrency=_limit(entity),
            max_queue=scaling_config(entity, stored=True).max_queue,
        )
        replica_set.followed = True
        return replica_set

    def forget(self, sets: Iterable[ReplicaSet]) -> None:
        """A follower's sets it no longer routes through: those of a cluster stop following the watch (requests
        still queued on them go on to the pods they know)."""
        for replica_set in sets:
            replica_set.detach()

    async def sweep(self, records: list[spec.EndpointRecord]) -> None:
        """On a cluster: delete the Deployments the gateways made that no stored endpoint needs any more (left by a
        leader that died between a rollout and its clean-up). Local leftovers are the replica book's."""
        if self.cluster is None:
            return
        from serving.replicas.cluster.objects import Wanted

        needed = {
            Wanted(r.name, str(e.name), f"models:/{e.entity_name}/{e.resolved_version}").name
            for r in records
            for config in (r.config, r.pending_config)
            if config is not None
            for e in spec.registry_entities(config)
        }
        try:
            for name in set(await run_in_threadpool(self.cluster.deployments.managed)) - needed:
                await run_in_threadpool(self.cluster.deployments.delete, name)
        except Exception as exc:
            log.error("left-over Deployments not removed: %s", exc)

    def _pods(self, endpoint: str, entity: spec.ServedEntityInput, *, lead: bool) -> ReplicaSet:
        from serving.replicas.cluster.objects import Wanted
        from serving.replicas.cluster.pod_set import PodSet

        assert self.cluster is not None
        wanted = Wanted(
            endpoint, str(entity.name), f"models:/{entity.entity_name}/{entity.resolved_version}", entity.workload_size
        )
        scaling = scaling_config(entity, stored=True)
        return PodSet(
            wanted,
            _model_name(entity),
            str(entity.resolved_version),
            self.cluster.routes,
            self.cluster.deployments if lead else None,
            max_concurrency=_limit(entity),
            scaling=scaling if lead else None,
            max_queue=scaling.max_queue,
        )


def served_keys(records: Iterable[spec.EndpointRecord]) -> set[ReplicaSetKey]:
    """(endpoint, served entity, model URI) of every model the stored endpoints' current configs serve: the
    replicas left running that a restarted gateway adopts (``ReplicaBook.left_running``)."""
    return {
        (r.name, str(e.name), f"models:/{e.entity_name}/{e.resolved_version}")
        for r in records
        for e in spec.registry_entities(r.config)
    }


def _model_name(entity: spec.ServedEntityInput) -> str:
    """The registry model a served entity serves (every entity placed on replicas has one)."""
    if entity.entity_name is None:
        raise ValueError(f"served entity {entity.name} names no registry model: it has no replicas to place")
    return entity.entity_name


def _limit(entity: spec.ServedEntityInput) -> int:
    return entity.max_concurrency or DEFAULT_MAX_CONCURRENCY
