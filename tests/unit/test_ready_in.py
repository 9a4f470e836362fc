"""What a replica asked for now needs to serve (``Sample.ready_in_s``), as the gateway's backends measure it:
the local backend times its last warm and cold starts, the pod set its last pods from the ask to the routing."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from serving.replicas.local_backend import LocalBackend


class Pool:
    def __init__(self, idle: int) -> None:
        self.standbys = idle

    @property
    def idle(self) -> int:
        return self.standbys

    def take(self):  # type: ignore[no-untyped-def]
        if not self.standbys:
            return None
        self.standbys -= 1
        return SimpleNamespace(pid=1)

    def fill(self) -> None:
        pass


class Launcher:
    """Activates a standby in 0.05 s; a new process is ready 0.6 s after its spawn."""

    def activate(self, replica, model_uri):  # type: ignore[no-untyped-def]
        time.sleep(0.05)
        return {"status": "ready"}

    def prepare(self) -> None:
        pass

    def start(self, model_uri):  # type: ignore[no-untyped-def]
        return SimpleNamespace(pid=2, url="http://127.0.0.1:1")


def test_the_local_backend_says_a_warm_start_while_a_standby_is_idle_and_a_cold_one_after(monkeypatch) -> None:
    import serving.replicas.local_backend as lb

    monkeypatch.setattr(lb, "wait_ready", lambda replica, *a: time.sleep(0.6) or {"status": "ready"})
    pool = Pool(idle=1)
    backend = LocalBackend(Launcher(), pool)  # type: ignore[arg-type]
    assert backend.ready_in_s() == 0.0  # nothing measured yet

    async def two_starts() -> None:
        await backend.start("models:/m/1")  # the standby
        await backend.start("models:/m/1")  # the pool is empty: a new process

    asyncio.run(two_starts())
    assert 0.05 <= backend.warm_start_s < backend.cold_start_s and backend.cold_start_s >= 0.6
    assert backend.ready_in_s() == backend.cold_start_s  # no standby idle
    pool.standbys = 1
    assert backend.ready_in_s() == backend.warm_start_s


def test_a_pod_set_measures_its_pods_from_the_ask_to_the_routing(monkeypatch) -> None:
    from serving.replicas.cluster import pod_set as ps
    from serving.replicas.cluster.objects import Wanted
    from serving.replicas.cluster.routes import PodReplica, Routes

    clock = [100.0]
    monkeypatch.setattr(ps.time, "monotonic", lambda: clock[0])

    async def scenario() -> tuple[float, float, float]:
        scaled: list[int] = []
        deployments = SimpleNamespace(scale=lambda name, n: scaled.append(n))  # a stand-in: scale only
        pods = ps.PodSet(Wanted("ep", "m-1", "models:/m/1"), "m", "1", Routes("ns"), deployments)  # type: ignore[arg-type]  # the stand-in
        pods.route_to([PodReplica("10.0.0.1", 8080, "a", "ns")])
        before = pods.ready_in_s()
        pods.scale_to(3)  # two pods asked for at t=100
        clock[0] = 108.0
        pods.route_to([PodReplica("10.0.0.1", 8080, "a", "ns"), PodReplica("10.0.0.2", 8080, "b", "ns")])
        first = pods.ready_in_s()
        clock[0] = 111.0
        pods.route_to([PodReplica(f"10.0.0.{i}", 8080, x, "ns") for i, x in ((1, "a"), (2, "b"), (3, "c"))])
        return before, first, pods.ready_in_s()

    assert asyncio.run(scenario()) == (0.0, 8.0, 11.0)
