"""The autoscaler inside the gateway: samples from the dispatchers, the controller stepped every second
on the gateway's event loop, replica counts and limits applied by each served entity's replica set.

- ``GatewaySignals`` is the controller's ``SignalSource``: each served entity's load meter (in flight,
  queued, arrivals, completions, latency; ``serving.traffic.load_meter``) plus its replicas' utilisation: the
  rate of each replica's busy clock (``serving.replica_server.metrics.BusyClock``, carried on its replies and
  kept by the dispatcher, ``Dispatcher.busy_clocks``), so a
  model that waits (on a remote call, a sleep, a device) counts as busy as one that computes; the
  process's CPU from ``/proc`` only until a replica has answered.
- ``LiveAutoscaler`` keeps the controller's entity set in step with the live endpoints, seeds a batched
  model's per-replica target from its batching plan (a replica that predicts 32 rows in one call can
  take 32 requests at once: that is what "model-aware" means on the vertical axis), applies the
  policy's per-replica admission limit (vertical axis on or off) and the queue bound through the replica
  set (``ReplicaSet.set_limits``), and steps at once when a request finds no replica (scale from zero
  does not wait for the next tick).
- ``ReplicaSets`` is the controller's ``Actuator``: ``set_replicas`` is the entity's ``ReplicaSet.scale_to``.

A replica is known by its id (``serving.traffic.replica``) here as in the dispatcher and in the readings other
gateways publish, whether it is a local process, another gateway's process or a pod.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Mapping

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.controller import Actuator, Controller, EntityKey
from serving.autoscaler.policy import seeded as policy_seeded
from serving.autoscaler.record import from_record, to_record
from serving.autoscaler.signals import Sample
from serving.endpoints.manager import EndpointManager
from serving.gateway.shared_scaling import LIMIT, RemoteLoad, SharedScaling, follow_limits, reading
from serving.replicas.replica_set import ReplicaSet
from serving.state.scaling import Reading, ScalerRecord

log = logging.getLogger(__name__)

_CLK_TCK = os.sysconf("SC_CLK_TCK")

Backlog = Callable[[str, str], float]  # (endpoint, entity) -> its stream backlog per second of max_lag_s


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process, from /proc (None if it is gone, or not on this machine: no pid)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


class MachineCpu:
    """The share of this machine's cores busy between two reads, from ``/proc/stat`` (every process counts:
    replicas, gateway, anything else on it). None on the first read, or where ``/proc/stat`` is missing."""

    def __init__(self, path: str = "/proc/stat") -> None:
        self.path = path
        self.cores = os.cpu_count() or 1
        self._last: tuple[int, int] | None = None  # (busy ticks, total ticks)

    def read(self) -> float | None:
        try:
            with open(self.path, "rb") as f:
                ticks = [int(x) for x in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, ValueError):
            return None
        total, busy = sum(ticks), sum(ticks) - ticks[3] - ticks[4]
        last, self._last = self._last, (busy, total)
        if last is None or total <= last[1]:
            return None
        return min(1.0, max(0.0, (busy - last[0]) / (total - last[1])))


def busy_share(before: float, after: float, seconds: float, outstanding: int) -> float:
    """A replica's busy share over the ``seconds`` between two samples, from its busy clock as its answers
    carried it (``before`` at the first sample, ``after`` at the second): the clock's rise over the
    interval, at most 1. When no answer came in between (the clock did not move), 1 if requests are
    outstanding -- a call longer than the interval is running -- else 0."""
    if after > before:
        return min(1.0, (after - before) / seconds)
    return 1.0 if outstanding > 0 else 0.0


class GatewaySignals:
    """The samples of this gateway's served entities; the leader of several adds the others' readings
    (``shared``: see ``serving.gateway.shared_scaling``). With ``machine`` (local replicas, which share this
    machine's cores) each sample carries the cores and how busy they were."""

    def __init__(
        self,
        manager: EndpointManager,
        shared: SharedScaling | None = None,
        wall: Callable[[], float] = time.time,
        backlog: Backlog | None = None,
        machine: MachineCpu | None = None,
    ) -> None:
        self.manager = manager
        self.backlog = backlog
        self.shared = shared
        self.wall = wall
        self.remote = RemoteLoad()
        self.machine = machine
        self._cpu: dict[str, tuple[float, float]] = {}  # replica id -> (cpu seconds, when)
        self._busy: dict[str, tuple[float, float]] = {}  # replica id -> (busy clock, when)
        self._totals: dict[EntityKey, tuple[int, int]] = {}  # a follower's arrivals and completions so far

    def _utilisation(self, replica_set: ReplicaSet, now: float, seen: Mapping[str, float]) -> float | None:
        """The mean busy share of the entity's replicas over the last interval (see :func:`busy_share`);
        for a replica that has not answered yet, the share of a core its process used (a process on this
        machine). ``seen``: the busy clocks other gateways saw, by replica id (the latest reading wins)."""
        shares = []
        clocks = replica_set.dispatcher.busy_clocks() if replica_set.dispatcher is not None else {}
        for replica in replica_set.replicas:
            clock = clocks.get(replica.id)
            if replica.id in seen:
                clock = max(clock or 0.0, seen[replica.id])
            if clock is not None:
                last_busy = self._busy.get(replica.id)
                self._busy[replica.id] = (clock, now)
                if last_busy is not None and now > last_busy[1]:
                    shares.append(busy_share(last_busy[0], clock, now - last_busy[1], replica.outstanding))
                    continue
            # not answered yet (or its first reading): the process's CPU, read only until the clock takes over
            cpu = cpu_seconds(replica.pid)
            if cpu is None:
                continue
            last_cpu = self._cpu.get(replica.id)
            self._cpu[replica.id] = (cpu, now)
            if last_cpu is not None and now > last_cpu[1]:
                shares.append(min(1.0, (cpu - last_cpu[0]) / (now - last_cpu[1])))
        return sum(shares) / len(shares) if shares else None

    def sample(self, now: float) -> Mapping[EntityKey, Sample]:
        out: dict[EntityKey, Sample] = {}
        current: set[str] = set()  # the replica ids sampled
        others = self.shared.remote() if self.shared is not None else []
        seen = RemoteLoad.busy_clocks(others)
        cores_busy = self.machine.read() if self.machine is not None else None
        cores = self.machine.cores if self.machine is not None and cores_busy is not None else 0
        for endpoint, live in list(self.manager.live.items()):
            for name, replica_set in live.replica_sets.items():
                if replica_set.dispatcher is None:
                    continue
                reading = replica_set.dispatcher.meter.read(now)
                ready = sum(r.alive() for r in replica_set.replicas)
                own = Sample(
                    t=now,
                    in_flight=reading.in_flight,
                    ready_replicas=ready,
                    replicas=ready + replica_set.starting,
                    queue_depth=reading.queue_depth,
                    requests=reading.arrivals,
                    completed=reading.completed,
                    latency_p50_ms=reading.latency_p50_ms,
                    latency_p99_ms=reading.latency_p99_ms,
                    utilisation=self._utilisation(replica_set, now, seen),
                    stream_backlog_per_s=self.backlog(endpoint, name) if self.backlog is not None else 0.0,
                    cores=cores,
                    cores_busy=cores_busy,
                    ready_in_s=replica_set.ready_in_s(),
                )
                mine = [r for r in others if r.key == (endpoint, name)]
                out[(endpoint, name)] = (
                    self.remote.merged(own, replica_set.model_uri, mine, reading.seconds) if mine else own
                )
                current.update(r.id for r in replica_set.replicas)
        for gone in (self._cpu.keys() | self._busy.keys()) - current:  # stopped replicas' readings
            self._cpu.pop(gone, None)
            self._busy.pop(gone, None)
        return out

    def readings(self, now: float) -> list[Reading]:
        """A follower's readings of every entity it routes, for the leader (``shared_scaling.reading``)."""
        out = []
        for endpoint, live in list(self.manager.live.items()):
            for name, replica_set in live.replica_sets.items():
                if replica_set.dispatcher is None:
                    continue
                load = replica_set.dispatcher.meter.read(now)
                before = self._totals.get((endpoint, name), (0, 0))
                totals = self._totals[(endpoint, name)] = (before[0] + load.arrivals, before[1] + load.completed)
                clocks = replica_set.dispatcher.busy_clocks()
                busy = {r.id: clocks[r.id] for r in replica_set.replicas if r.id in clocks}
                out.append(
                    Reading(
                        self.shared.me if self.shared else "",
                        endpoint,
                        name,
                        replica_set.model_uri,
                        self.wall(),
                        reading(load, totals, busy),
                    )
                )
        return out


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
                # with the per-replica limit it enforces, which followers enforce too (``follow_limits``)
                record = {**to_record(state, samples, shift), LIMIT: replica_set.max_concurrency}
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
        replica_set = self.manager.replica_set(endpoint, entity)
        if replica_set is not None and replica_set.scaling is not None:
            replica_set.set_limits(max_concurrency=limit)

    def _set_queue(self, endpoint: str, entity: str, limit: int) -> None:
        """With ``shed_load``, the policy's queue bound: what can wait and still be answered within the SLO
        (see ``policy.queue_bound``); requests past it get a 429 at once, those already waiting stay.
        Without it, ``max_queue``."""
        replica_set = self.manager.replica_set(endpoint, entity)
        if replica_set is not None and replica_set.scaling is not None:
            replica_set.set_limits(max_queue=limit if replica_set.scaling.shed_load else replica_set.scaling.max_queue)

    def step(self) -> None:
        self._poke = None
        if not self.manager.leading:  # one of several gateways, not the leader: the leader scales
            if self.shared is not None:
                self.shared.offer(self.signals.readings(self.clock()))
                follow_limits(self.manager.live, self.shared.recorded)
            return
        self.sync()
        now = self.clock()
        self._last_step = now
        self.controller.step(now)
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
