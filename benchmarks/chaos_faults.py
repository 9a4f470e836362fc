"""The chaos soak's faults: when they come (``plan``: pure, from a seed) and how each is done to the running local
stack (``Injector``).

Three kinds:
- ``replica``: ``kill -9`` of one replica process of the endpoint, picked at random among those the gateways list;
- ``gateway``: ``kill -9`` of one of the stack's gateways, picked at random, then, ``RESTART_AFTER_S`` later, the
  same gateway started again as ``make up`` started it (``infra.stack.start_again``): the stack restarts nothing
  by itself;
- ``postgres``: the gateways' state store stopped (PostgreSQL's fast shutdown), down for ``POSTGRES_DOWN_S``, then
  started again the same way; exactly once per run.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import psutil

from infra.processes import MARK, ProcessRecord, stop_record
from infra.stack import grace_s, is_gateway, start_again
from infra.stack_config import HOST, StackConfig
from infra.stack_record import StackRecord

GAP_S = 20.0  # the least time between two planned faults
MEAN_GAP_S = 40.0  # their mean spacing, when the run is long enough
LEAD_S = 20.0  # no fault in the run's first seconds: the load has settled when the first comes
TAIL_S = 30.0  # nor in its last: the recovery from the last fault is measured too
RESTART_AFTER_S = 3.0  # a killed gateway is started again this long after it died (a supervisor's delay)
POSTGRES_DOWN_S = 5.0
KINDS = ("replica", "gateway", "postgres")


@dataclass(frozen=True)
class Planned:
    at_s: float  # seconds after the load began
    kind: str


@dataclass(frozen=True)
class Fault:
    """A fault as it was done: when it began and when what it hit was back (a replica kill ends at once; the
    gateway or PostgreSQL when it answers again), both in seconds after the load began."""

    kind: str
    planned_s: float
    at_s: float
    ended_s: float
    target: str
    error: str | None = None  # the fault could not be done, or what it hit did not come back


def plan(seed: int, duration_s: float) -> list[Planned]:
    """The run's faults: exactly one PostgreSQL restart and at least one kill of each other kind (when three fit),
    the rest replica or gateway kills at random; at random times between ``LEAD_S`` and ``TAIL_S`` before the end,
    ``GAP_S`` apart at least and ``MEAN_GAP_S`` on average."""
    span = duration_s - LEAD_S - TAIL_S
    if span < 0:
        raise ValueError(f"a run of {duration_s:.0f} s has no room for a fault: it needs {LEAD_S + TAIL_S:.0f} s")
    rng = random.Random(seed)
    n = min(int(span // GAP_S) + 1, max(3, round(span / MEAN_GAP_S)))
    kinds = ["postgres", "replica", "gateway"][:n] + [rng.choice(("replica", "gateway")) for _ in range(n - 3)]
    rng.shuffle(kinds)
    offsets = sorted(rng.uniform(0.0, span - (n - 1) * GAP_S) for _ in range(n))
    return [
        Planned(round(LEAD_S + offset + i * GAP_S, 1), kind) for i, (offset, kind) in enumerate(zip(offsets, kinds))
    ]


class Injector:
    """Does planned faults to the running stack of ``config`` (started with ``environ``), on the endpoint
    ``endpoint``; random choices (which replica, which gateway) from ``rng``; times from ``began``."""

    def __init__(
        self, config: StackConfig, environ: Mapping[str, str], endpoint: str, rng: random.Random, began: float
    ) -> None:
        self.config, self.environ, self.endpoint, self.rng, self.began = config, environ, endpoint, rng, began
        self.headers = {"Authorization": f"Bearer {environ['TOLLFREE_TOKEN']}"}

    def run(self, planned: Planned) -> Fault:
        """Do ``planned`` now; never raises for a fault that could not be done (the fault says so)."""
        at = time.monotonic()
        try:
            target, error = getattr(self, f"_{planned.kind}")(), None
        except (RuntimeError, OSError, httpx.HTTPError, psutil.Error) as exc:
            target, error = planned.kind, f"{type(exc).__name__}: {exc}"
        ended = time.monotonic()
        return Fault(planned.kind, planned.at_s, round(at - self.began, 1), round(ended - self.began, 1), target, error)

    def _record(self) -> StackRecord:
        record = StackRecord.load(self.config.record_path)
        if record is None:
            raise RuntimeError(f"no stack recorded in {self.config.record_path}")
        return record

    def _replica(self) -> str:
        """``kill -9`` of a replica the gateways list (the leader lists its replicas' pids), checked to be a
        replica process of this stack."""
        record = self._record()
        listed: set[int] = set()
        for port in self.config.gateway_ports():
            try:
                reply = httpx.get(
                    f"http://{HOST}:{port}/api/2.0/serving-endpoints/{self.endpoint}/replicas",
                    headers=self.headers,
                    timeout=10,
                )
            except httpx.TransportError:
                continue  # a gateway being restarted
            if reply.status_code == 200:
                listed.update(r["pid"] for r in reply.json()["replicas"] if r["pid"] is not None and r["alive"])
        ours = sorted(pid for pid in listed if _is_replica(pid, record.stack_id))
        if not ours:
            raise RuntimeError(f"no gateway lists a live replica of {self.endpoint}: nothing killed")
        pid = self.rng.choice(ours)
        os.kill(pid, signal.SIGKILL)
        return f"replica pid {pid} (of {len(ours)})"

    def _gateway(self) -> str:
        """``kill -9`` of a gateway at random, then the same gateway started again."""
        record = self._record()
        name = self.rng.choice(sorted(n for n in record.services if is_gateway(n)))
        proc = record.services[name]
        leader = self._leader_pid()
        os.kill(proc.pid, signal.SIGKILL)
        _wait_dead(proc)
        time.sleep(RESTART_AFTER_S)
        (started,) = start_again(self.config, self.environ, [name])
        role = "the leader" if leader == proc.pid else "a follower" if leader is not None else "leader unknown"
        return f"{name} (pid {proc.pid}, {role}); started again as pid {started.pid}"

    def _postgres(self) -> str:
        """The state store stopped (SIGINT: PostgreSQL's fast shutdown, which ends its sessions), down for
        ``POSTGRES_DOWN_S``, started again."""
        proc = self._record().services["postgres"]
        killed = stop_record(proc, grace_s("postgres"), first=signal.SIGINT)
        stopped = time.monotonic()
        time.sleep(POSTGRES_DOWN_S)
        (started,) = start_again(self.config, self.environ, ["postgres"])
        down = time.monotonic() - stopped
        return f"postgres (pid {proc.pid}{', killed after its grace' if killed else ''}) down {down:.1f} s; " + (
            f"started again as pid {started.pid}"
        )

    def _leader_pid(self) -> int | None:
        """The pid the leader lease names, or None when the store does not answer."""
        from sqlalchemy.exc import SQLAlchemyError

        from serving.state.database import open_database
        from serving.state.lease import Lease

        pg = self.config.postgres
        if pg is None:
            return None
        try:
            database = open_database(pg.url())
            try:
                holder = Lease(database).holder()
            finally:
                database.engine.dispose()
        except SQLAlchemyError:  # the store does not answer: unknown, not fatal
            return None
        pid = holder[0].split("/")[1] if holder is not None else ""  # holder: host/pid/random part
        return int(pid) if pid.isdigit() else None


def _is_replica(pid: int, stack_id: str) -> bool:
    """``pid`` is a replica process started by this stack (its command and the stack's mark in its environment)."""
    try:
        proc = psutil.Process(pid)
        return "serving.replica_server" in " ".join(proc.cmdline()) and proc.environ().get(MARK) == stack_id
    except psutil.Error:
        return False


def _wait_dead(proc: ProcessRecord, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while proc.alive():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} (pid {proc.pid}) still runs {timeout_s:.0f} s after kill -9")
        time.sleep(0.05)
