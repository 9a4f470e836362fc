"""What the gateway's autoscaler reads each second: ``GatewaySignals`` is the controller's ``SignalSource``, each
served entity's load meter (in flight, queued, arrivals, completions, latency; ``serving.traffic.load_meter``) plus
its replicas' utilisation: the rate of each replica's busy clock (``serving.replica_server.metrics.BusyClock``,
carried on its replies and kept by the dispatcher, ``Dispatcher.busy_clocks``), so a model that waits (on a remote
call, a sleep, a device) counts as busy as one that computes; the process's CPU from ``/proc`` only until a replica
has answered. The leader of several gateways adds the others' readings (``serving.gateway.shared_scaling``).

A replica is known by its id (``serving.traffic.replica``) here as in the dispatcher and in the readings other
gateways publish, whether it is a local process, another gateway's process or a pod.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from serving.autoscaler.controller import EntityKey
from serving.autoscaler.signals import Sample
from serving.endpoints.manager import EndpointManager
from serving.gateway.shared_scaling import RemoteLoad, SharedScaling, reading
from serving.replicas.replica_set import ReplicaSet
from serving.state.scaling import Reading

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
