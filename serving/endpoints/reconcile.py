"""A gateway's endpoints brought in line with the store it shares with other gateways.

``restore``: a gateway that starts on existing state brings every stored endpoint back up, adopting the live
replicas a crashed predecessor left (replica table, then health check, then ``/adopt``), starting only what is
missing and stopping the rest. Several gateways on one store elect a leader (``serving.gateway.leadership``):
``lead`` takes over what the previous leader ran, ``reconcile`` has the leader apply what other gateways
wrote, and ``follow`` routes a follower's data plane to the replicas the leader runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.ai_gateways import AiGateways
from serving.endpoints.live import LiveEndpoint, external_models, stream_inputs
from serving.endpoints.placement import Placement, served_keys
from serving.endpoints.rollouts import Rollouts
from serving.endpoints.store import EndpointStore
from serving.replicas.book import ReplicaBook
from serving.replicas.remote import RemoteReplica
from serving.replicas.replica_set import ReplicaSet

if TYPE_CHECKING:
    from serving.replicas.cluster.connect import Cluster

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(
        self,
        store: EndpointStore,
        rollouts: Rollouts,
        book: ReplicaBook,
        placement: Placement,
        ai_gateways: AiGateways,
        attach: Callable[[ReplicaSet], None],
        cluster: Cluster | None = None,
    ) -> None:
        self.store = store
        self.rollouts = rollouts
        self.book = book
        self.placement = placement
        self.ai_gateways = ai_gateways
        self._attach = attach  # connects a new replica set to the replica client
        self.cluster = cluster

    async def restore(self) -> None:
        """On gateway start: bring every stored endpoint's current config back up.

        Until its replicas can answer, an endpoint is ``NOT_READY`` and its requests wait for them (up to
        the request timeout) rather than failing: it was serving before the restart, and its clients
        should see a slow answer, not an error."""
        records = await run_in_threadpool(self.store.list)
        left = await self.book.left_running(served_keys(records))
        for record in records:
            self.ai_gateways.remember(record)
            record.ready = "NOT_READY"
            record.config_update = "IN_PROGRESS"
            record.pending_config = None
            record.state_message = "the gateway restarted: starting the endpoint's replicas"
            await run_in_threadpool(self.store.put, record, self.rollouts.fence)
            self.rollouts.mark_restoring(record.name)
            self.rollouts.spawn(record.name, record.config, record.config_version, left)

    async def lead(self) -> None:
        """This gateway has become the leader: adopt the replicas the previous leader left (its process is
        gone) and run every endpoint from here on. Requests keep flowing through the followed routing until
        each endpoint's own replica sets replace it.

        An endpoint's current config is taken over (adopted) first, even when a change waits: only a set this
        gateway owns is stopped once the change serves. It leads once the takeovers are under way: a change sent
        through it before then goes to the store, as a follower's does, and ``reconcile`` rolls it out after
        the takeover (started at once, it would leave out the replicas the takeover had yet to adopt)."""
        records = await run_in_threadpool(self.store.list)
        left = await self.book.left_running(served_keys(records))
        await self.placement.sweep(records)
        for record in records:
            if not self.rollouts.running(record.name):
                self.rollouts.spawn(record.name, record.config, record.config_version, left)
                if record.config_update == "IN_PROGRESS" and record.pending_config is not None:
                    self.rollouts.spawn(record.name, record.pending_config, record.config_version + 1)
        self.rollouts.leading = True

    async def reconcile(self) -> None:
        """The leader applies what other gateways wrote: endpoints created or updated through them (a
        rollout starts), or deleted (their replicas stop)."""
        records = await run_in_threadpool(self.store.list)
        for record in records:
            self.ai_gateways.remember(record)
            # in progress and nobody here rolling it out: written by a follower, or by a leader that died in the
            # middle; a failed rollout is UPDATE_FAILED, so it is not retried until the next change
            if record.config_update == "IN_PROGRESS" and not self.rollouts.running(record.name):
                config, version = _target(record)
                self.rollouts.spawn(record.name, config, version)
        live = self.rollouts.live
        for name in {n for n in live if not self.rollouts.running(n)} - {r.name for r in records}:
            gone = live.pop(name, None)  # a delete through this gateway may have taken it meanwhile
            if gone is not None:
                await self.rollouts.stop_all(gone.replica_sets.values())

    async def follow(self) -> None:
        """A follower's data plane, refreshed from the store: every endpoint's config routed to the replicas
        the replica table lists for it (run by the leader). Replicas kept across refreshes keep their counts.

        A gateway that led until now (its lease lost while it lived: the store out of its reach for longer than
        the lease) hands its own replicas over: each of its sets keeps serving until the table lists the new
        leader's replicas of the same entity, then stops (its requests answered) and its rows leave the table.
        The new leader cannot adopt them (their owner lives), so without this they would run on, unmanaged."""
        records = await run_in_threadpool(self.store.list)
        rows = await self.book.routes() if self.cluster is None else {}  # a cluster's sets follow its watch
        live = self.rollouts.live
        handed_over: list[ReplicaSet] = []
        for record in records:
            self.ai_gateways.remember(record)
            before = live.get(record.name)
            replica_sets: dict[str, ReplicaSet] = {}
            for served_entity in spec.registry_entities(record.config):
                uri = f"models:/{served_entity.entity_name}/{served_entity.resolved_version}"
                name = str(served_entity.name)
                listed = [r for r in rows.get((record.name, name, uri), []) if r.owner_pid != os.getpid()]
                replica_set = before.replica_sets.get(name) if before is not None else None
                if self.cluster is None and replica_set is not None and _own(replica_set):
                    if replica_set.model_uri == uri and not listed:
                        replica_sets[name] = replica_set  # serves on until the new leader's replicas are listed
                        continue
                    handed_over.append(replica_set)
                if replica_set is None or replica_set.model_uri != uri or not replica_set.followed:
                    replica_set = self.placement.follow(record.name, served_entity)
                    self._attach(replica_set)
                if self.cluster is None:
                    replica_set.route_to([RemoteReplica(r.replica_id, r.host, r.port) for r in listed])
                replica_sets[name] = replica_set
            if before is None or _routing(before) != _routing_of(replica_sets, record.config):
                live[record.name] = LiveEndpoint.of(replica_sets, record.config)
                if before is not None:
                    self.placement.forget([s for s in before.replica_sets.values() if s not in replica_sets.values()])
        for name in set(live) - {r.name for r in records}:
            gone = live.pop(name).replica_sets.values()
            handed_over.extend(s for s in gone if self.cluster is None and _own(s))
            self.placement.forget(gone)
        if handed_over:
            log.info("following: stopping %d replica set(s) this gateway ran as leader", len(handed_over))
            self.rollouts.spawn_stop(handed_over)


def _own(replica_set: ReplicaSet) -> bool:
    """A set whose replicas this gateway runs (it started them as leader), not one that follows another's."""
    return not replica_set.followed and replica_set.backend is not None


def _target(record: spec.EndpointRecord) -> tuple[spec.EndpointCoreConfig, int]:
    """The config an endpoint should run: its pending one while an update is in progress, else its own."""
    if record.config_update == "IN_PROGRESS" and record.pending_config is not None:
        return record.pending_config, record.config_version + 1
    return record.config, record.config_version


def _routing(live: LiveEndpoint) -> tuple[object, ...]:
    """What a follower's refresh compares to decide whether an endpoint's routing changed."""
    return live.replica_sets, live.weights, live.streams, live.external


def _routing_of(replica_sets: dict[str, ReplicaSet], config: spec.EndpointCoreConfig) -> tuple[object, ...]:
    return replica_sets, spec.traffic_weights(config), stream_inputs(config), external_models(config)
