"""The autoscaler inside the gateway: the controller stepped every second on the gateway's event loop on the
samples ``serving.gateway.scaling_signals`` takes, replica counts and limits applied by each served entity's
replica set.

- ``LiveAutoscaler`` keeps the controller's entity set in step with the live endpoints, seeds a batched
  model's per-replica target from its batching plan (a replica that predicts 32 rows in one call can
  take 32 requests at once: that is what "model-aware" means on the vertical axis), applies the
  policy's per-replica admission limit (vertical axis on or off) and the queue bound through the replica
  set (``ReplicaSet.set_limits``), and steps at once when a request finds no replica (scale from zero
  does not wait for the next tick).
- ``ReplicaSets`` is the controller's ``Actuator``: ``set_replicas`` is the entity's ``ReplicaSet.scale_to``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import Actuator, Controller, EntityKey
from serving.autoscaler.policy import seeded as policy_seeded
from serving.autoscaler.record import from_record, to_record
from serving.endpoints.manager import EndpointManager
from serving.gateway.gateway_shares import Shares
from serving.gateway.scaling_signals import Backlog, GatewaySignals, MachineCpu
from serving.gateway.shared_scaling import HEARTBEAT, LIMIT, SharedScaling, follow_limits
from serving.replicas.replica_set import ReplicaSet
from serving.state.scaling import Reading, ScalerRecord

log = logging.getLogger(__name__)


def replica_serves(replica_set: ReplicaSet) -> int | None:
    """What one replica of ``replica_set`` predicts at once, from the batching plan it measured: a batch when
    batching pays, else a request (it predicts one call at a time); None until a replica has measured it."""
    dispatcher = replica_set.dispatcher
    if dispatcher is None or dispatcher.plan.single_ms <= 0:
        return None
    return dispatcher.plan.max_batch if dispatcher.plan.enabled else 1


def seeded(config: ScalingConfig, replica_set: ReplicaSet) -> ScalingConfig:
    """The config with its starting target seeded from what a replica predicts at once (``policy.seeded``);
    unchanged until a replica has measured its model."""
    serves = replica_serves(replica_set)
    return config if serves is None else policy_seeded(config, serves)


class ReplicaSets:
    """The controller's ``Actuator`` in the gateway: each live served entity's replica set applies its own
    count (``ReplicaSet.scale_to``): its backend starts and stops the processes, or the cluster the pods."""

    def __init__(self, manager: EndpointManager) -> None:
        self.manager = manager

    def _set(self, endpoint: str, entity: str) -> ReplicaSet:
        replica_set = self.manager.replica_set(endpoint, entity)
        if replica_set is None:
            raise LookupError(f"served entity {endpoint}/{entity} is not live")
        return replica_set

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        self._set(endpoint, entity).scale_to(n)

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        return self._set(endpoint, entity).ready_count()


POKE_GAP_S = 0.05  # a poked step runs at least this long after the one before


RECORD_EVERY_S = 5.0  # the leader records its state this often (what a new leader may lose at most)


class LiveAutoscaler:
    """Steps the controller every ``interval_s`` on the leader. With ``shared`` (the state store's side,
    ``serving.gateway.shared_scaling``) a follower publishes its load instead, and the leader records its
    state and continues from the recorded one for an entity it did not decide for before."""

    def __init__(
        self,
        manager: EndpointManager,
        actuator: Actuator | None = None,
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        shared: SharedScaling | None = None,
        backlog: Backlog | None = None,
        machine: MachineCpu | None = None,
    ) -> None:
        self.manager = manager
        self.interval_s = interval_s
        self.clock = clock
        self.wall = wall
        self.shared = shared
        self.signals = GatewaySignals(manager, shared, wall, backlog, machine)
        self.controller = Controller(
            self.signals,
            actuator or ReplicaSets(manager),
            {},
            concurrency_sink=self._set_limit,
            queue_sink=self._set_queue,
        )
        # key -> the replica set the controller has a config for (a new set: a new version or rollout) and that config
        self._configs: dict[EntityKey, tuple[ReplicaSet, ScalingConfig]] = {}
        self._last_step = 0.0
        self._last_record: float | None = None
        self.shares = Shares()  # how many gateways send to each entity's replicas (``gateway_shares``)
        self._policy_limits: dict[EntityKey, int] = {}  # the policy's per-replica limit, before the share
        self._poke: asyncio.Handle | None = None
        self.after_step: Callable[[], None] | None = None  # the leader's, after each step (the console's timeline)

    def _resume(self, key: EntityKey, replica_set: ReplicaSet, config: ScalingConfig) -> None:
        """Continue from the recorded state of the same entity and model, unless it is older than the windows."""
        found = self.shared.recorded.get(key) if self.shared is not None else None
        if (
            found is None
            or found.model_uri != replica_set.model_uri
            or found.at < self.wall() - config.scale_down_window_s
        ):
            return
        now = self.clock()
        try:
            state, samples = from_record(found.state, config, now - self.wall())
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("autoscaler record of %s/%s not used: %s", key[0], key[1], type(exc).__name__)
            return
        self.controller.resume(key, state, samples, now)
        log.info(
            "autoscaler for %s/%s continues from its record: %d replicas, target %.1f, %d samples",
            key[0],
            key[1],
            state.replicas,
            state.target,
            len(samples),
        )

    def _record(self, now: float) -> None:
        if self.shared is None or (self._last_record is not None and now - self._last_record < RECORD_EVERY_S):
            return
        self._last_record = now
        shift, wall = self.wall() - now, self.wall()
        records = []
        for key, (state, samples) in self.controller.snapshot().items():
            replica_set = self.manager.replica_set(*key)
            if replica_set is not None:
                # with the policy's per-replica limit, which followers enforce too (``follow_limits``)
                limit = self._policy_limits.get(key, replica_set.max_concurrency)
                record = {**to_record(state, samples, shift), LIMIT: limit}
                records.append(ScalerRecord(key[0], key[1], replica_set.model_uri, wall, record))
        self.shared.record(records)

    def sync(self) -> None:
        """Follow the live endpoints: new or re-deployed entities in, removed ones out."""
        seen: set[EntityKey] = set()
        for endpoint, live in list(self.manager.live.items()):
            for name, replica_set in live.replica_sets.items():
                scaling = replica_set.scaling
                if scaling is None or replica_set.dispatcher is None:
                    continue
                key = (endpoint, name)
                seen.add(key)
                known = self._configs.get(key)
                if known is None or known[0] is not replica_set or known[1] != scaling:
                    if known is None or known[0] is not replica_set:
                        self.controller.remove(key)  # a new set (new version): start from its own plan
                    config = seeded(scaling, replica_set)
                    self.controller.set_config(key, config, len(replica_set.replicas), replica_serves(replica_set))
                    if known is None:  # not decided for here before: perhaps by a previous leader
                        self._resume(key, replica_set, config)
                    self._configs[key] = (replica_set, scaling)
                    # hold a burst while replicas start, rather than refuse it (the 5 s wait still bounds it)
                    replica_set.set_limits(max_queue=scaling.max_queue, queue_cap=scaling.max_queue)
                replica_set.dispatcher.on_starved = self.poke
        for key in set(self._configs) - seen:
            self.controller.remove(key)
            del self._configs[key]

    def _set_limit(self, endpoint: str, entity: str, limit: int) -> None:
        """The policy's per-replica admission limit, whether the vertical axis moves the target or not: the
        replicas take what the horizontal axis sized them for, never the endpoint's default of 32."""
        self._policy_limits[(endpoint, entity)] = limit
        replica_set = self.manager.replica_set(endpoint, entity)
        if replica_set is not None and replica_set.scaling is not None:
            replica_set.set_limits(max_concurrency=self.shares.limit((endpoint, entity), limit))

    def _apply_shares(self) -> None:
        """The policy's limits scaled by the entity's share now: a gateway gone since the last step raises them."""
        for key, limit in list(self._policy_limits.items()):
            replica_set = self.manager.replica_set(*key)
            if replica_set is None or replica_set.scaling is None:
                del self._policy_limits[key]
            elif (scaled := self.shares.limit(key, limit)) != replica_set.max_concurrency:
                replica_set.set_limits(max_concurrency=scaled)

    def _count_gateways(self) -> None:
        """Who sends to each live entity's replicas now, and (the leader) a heartbeat for the others to count."""
        if self.shared is None:
            return
        keys = [(e, n) for e, live in list(self.manager.live.items()) for n in live.replica_sets]
        self.shares.observe(self.clock(), keys, self.shared.members())
        if self.manager.leading:
            beats = []
            for endpoint, live in list(self.manager.live.items()):
                for name, replica_set in live.replica_sets.items():
                    beats.append(
                        Reading(self.shared.me, endpoint, name, replica_set.model_uri, self.wall(), {HEARTBEAT: 1})
                    )
            self.shared.offer(beats)

    def _set_queue(self, endpoint: str, entity: str, limit: int) -> None:
        """With ``shed_load``, the policy's queue bound: what can wait and still be answered within the SLO
        (see ``policy.queue_bound``); requests past it get a 429 at once, those already waiting stay.
        Without it, ``max_queue``."""
        replica_set = self.manager.replica_set(endpoint, entity)
        if replica_set is not None and replica_set.scaling is not None:
            replica_set.set_limits(max_queue=limit if replica_set.scaling.shed_load else replica_set.scaling.max_queue)

    def step(self) -> None:
        self._poke = None
        self._count_gateways()
        if not self.manager.leading:  # one of several gateways, not the leader: the leader scales
            if self.shared is not None:
                self.shared.offer(self.signals.readings(self.clock()))
                follow_limits(self.manager.live, self.shared.recorded, self.shares)
            return
        self.sync()
        now = self.clock()
        self._last_step = now
        self.controller.step(now)
        self._apply_shares()
        self._record(now)
        if self.after_step is not None:
            self.after_step()

    def poke(self) -> None:
        """Step soon (a request found no replica): at once, or 50 ms after the last step when that was
        sooner -- never dropped, or the request would wait for the next tick (up to ``interval_s``)."""
        if self._poke is not None:
            return
        loop = asyncio.get_running_loop()
        wait = POKE_GAP_S - (self.clock() - self._last_step)
        self._poke = loop.call_later(wait, self.step) if wait > 0 else loop.call_soon(self.step)

    async def run(self) -> None:
        next_at = self.clock()
        while True:
            try:
                self.step()
            except Exception:  # the loop must outlive a bad step
                log.exception("autoscaler step failed")
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - self.clock()))
