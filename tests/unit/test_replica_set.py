"""The replica set, the one owner of a served entity's replicas and limits, on a fake backend (no process):
scale up and down, a scale-down that takes replicas still starting before ready ones, dead replicas out of the routing,
limits applied to the dispatcher, stop. Real processes: tests/integration/test_local_backend.py."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

from benchmarks.fidelity import ADDED
from serving.protocol.wire import WireReply
from serving.replicas.replica_set import ReplicaSet
from tests.waiting import until_async


@dataclass(eq=False)
class FakeReplica:
    pid: int
    outstanding: int = 0
    dead: bool = False
    process: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(returncode=-9))

    @property
    def id(self) -> str:
        return f"local:127.0.0.1:{self.pid}:{self.pid}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.pid}"

    def alive(self) -> bool:
        return not self.dead


class FakeBackend:
    """Starts replicas that become ready when the test releases them; records what it stopped."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.next_pid = 100
        self.stopped: list[int] = []
        self.prepared = threading.Event()  # set: prepare returns (the fork server's imports are done)
        self.prepared.set()
        self.events: list[str] = []

    def prepare(self) -> None:
        self.events.append("prepare")
        assert self.prepared.wait(10), "the test never let prepare return"

    def _new(self) -> FakeReplica:
        self.next_pid += 1
        return FakeReplica(self.next_pid)

    def spawn(self, model_uri: str) -> FakeReplica:
        self.events.append("spawn")
        return self._new()

    def wait_ready(self, replica: FakeReplica, timeout_s: float) -> dict:
        return {"batching": None}

    async def start(self, model_uri: str) -> tuple[FakeReplica, dict]:
        await self.release.wait()
        return self._new(), {"batching": None}

    async def stop(self, replica: FakeReplica) -> None:
        self.stopped.append(replica.pid)


async def _never(replica, requests) -> WireReply:  # pragma: no cover - nothing is dispatched here
    raise AssertionError("no request is sent")


async def _settle(served: ReplicaSet) -> None:
    while served.starting:
        await asyncio.sleep(0)
    for _ in range(3):
        await asyncio.sleep(0)


def test_a_rollout_starts_its_replicas_and_stop_stops_them():
    async def scenario() -> tuple[int, list[int]]:
        backend = FakeBackend()
        served = ReplicaSet("champion", "m", "1", backend, endpoint="e")
        await served.start(2, timeout_s=1.0)
        count = served.ready_count()
        await served.stop()
        return count, backend.stopped

    count, stopped = asyncio.run(scenario())
    assert count == 2 and stopped == [101, 102]


def test_a_rollout_prepares_its_backend_off_the_event_loop_before_it_spawns():
    """The first rollout of a gateway waits for the fork server's imports (seconds): in a thread, so the
    gateway's loop answers meanwhile (a status poll with a 5 s timeout fails otherwise)."""

    async def scenario() -> tuple[int, list[str], int]:
        backend = FakeBackend()
        backend.prepared.clear()  # prepare blocks until the test, on the loop, lets it return
        served = ReplicaSet("champion", "m", "1", backend, endpoint="e")
        rollout = asyncio.create_task(served.start(1, timeout_s=1.0))
        # the loop keeps turning while prepare blocks: were prepare on the loop, this wait could not run
        await until_async(lambda: backend.events == ["prepare"], "prepare was never called")
        spawned_while_preparing = backend.events.count("spawn")
        backend.prepared.set()
        await rollout
        return spawned_while_preparing, backend.events, served.ready_count()

    spawned_while_preparing, events, ready = asyncio.run(scenario())
    assert spawned_while_preparing == 0 and events == ["prepare", "spawn"] and ready == 1


def test_a_scale_down_while_starting_holds_when_the_starts_complete(caplog):
    async def scenario() -> tuple[int, list[int], int]:
        backend = FakeBackend()
        served = ReplicaSet("champion", "m", "1", backend, endpoint="e")
        served.scale_to(3)
        starting = served.starting
        served.scale_to(1)  # all three still starting: the count holds when they come up
        backend.release.set()
        await _settle(served)
        return starting, backend.stopped, served.ready_count()

    with caplog.at_level(logging.INFO, logger="serving.replicas.replica_set"):
        starting, stopped, ready = asyncio.run(scenario())
    assert starting == 3 and ready == 1 and len(stopped) == 2
    added = [ADDED.search(r.getMessage()) for r in caplog.records]
    assert [(m.group(2), m.group(3)) for m in added if m] == [("e", "1")]  # the line the fidelity benchmark reads


def test_a_scale_down_during_a_start_takes_the_starting_replica_and_keeps_the_ready_one():
    async def scenario() -> tuple[list[int], list[int], list[int]]:
        backend = FakeBackend()
        ready = FakeReplica(1)
        served = ReplicaSet("champion", "m", "1", backend, endpoint="e", replicas=[ready], drain_timeout_s=0.05)
        served.scale_to(2)  # one more starting
        served.scale_to(1)  # the flap back: the start goes, the replica that serves stays
        routed = [r.pid for r in served.replicas]
        backend.release.set()
        await _settle(served)
        return routed, [r.pid for r in served.replicas], backend.stopped

    routed, after, stopped = asyncio.run(scenario())
    assert routed == [1] and after == [1] and stopped == [101]


def test_surplus_replicas_leave_the_routing_at_once_and_dead_ones_when_counted():
    async def scenario() -> tuple[int, int, list[int], int]:
        backend = FakeBackend()
        busy, idle, other = FakeReplica(1, outstanding=2), FakeReplica(2), FakeReplica(3)
        served = ReplicaSet(
            "champion", "m", "1", backend, endpoint="e", replicas=[busy, idle, other], drain_timeout_s=0.05
        )
        served.scale_to(2)  # the least busy leaves first, and stops once drained
        after_down = len(served.replicas)
        other.dead = True
        counted = served.ready_count()
        await until_async(lambda: backend.stopped, "the surplus replica never stopped once drained")
        return after_down, counted, backend.stopped, busy in served.replicas

    after_down, counted, stopped, busy_kept = asyncio.run(scenario())
    assert after_down == 2 and counted == 1 and stopped == [2] and busy_kept


def test_a_dead_replica_is_replaced_at_once_and_the_dispatcher_holds_requests_for_its_replacement():
    async def scenario() -> tuple[bool, int, bool, list[int], list[int]]:
        backend = FakeBackend()
        dead = FakeReplica(1)
        served = ReplicaSet("champion", "m", "1", backend, endpoint="e", replicas=[dead])
        dispatcher = served.attach(_never)
        dead.dead = True
        served.lost(dead)  # what the dispatcher calls when it cannot reach it
        holding, starting = dispatcher.replacing(), served.starting
        backend.release.set()
        await _settle(served)
        return holding, starting, dispatcher.replacing(), [r.pid for r in served.replicas], backend.stopped

    holding, starting, still_holding, replicas, stopped = asyncio.run(scenario())
    assert holding and starting == 1  # the replacement started at once, and requests are held for it
    assert not still_holding and replicas == [101] and stopped == []


def test_limits_reach_the_dispatcher():
    served = ReplicaSet("champion", "m", "1", replicas=[FakeReplica(1)], max_concurrency=4)
    dispatcher = served.attach(_never)
    served.set_limits(max_concurrency=9, max_queue=7)
    assert served.max_concurrency == 9 and dispatcher.max_queue == 7
    served.configure(3, None)
    assert served.max_concurrency == 3 and served.scaling is None
