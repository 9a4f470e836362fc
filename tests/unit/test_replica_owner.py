"""A local replica's owner watch (pure: liveness and clock injected), its ``POST /adopt`` route, and the liveness
check it uses by default (against a real killed process its parent has not reaped)."""

from __future__ import annotations

import os
import subprocess

from fastapi.testclient import TestClient

from serving.replica_server.owner import Adoptable, OwnerWatch, first_owner, pid_alive


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watch_with(alive: set[int], grace_s: float = 60.0) -> tuple[OwnerWatch, Clock]:
    clock = Clock()
    return OwnerWatch(10, grace_s, alive=lambda pid: pid in alive, clock=clock), clock


def test_an_orphan_waits_its_grace_from_the_first_time_it_sees_its_owner_gone():
    alive = {10}
    owner, clock = watch_with(alive)
    assert not owner.expired()
    alive.clear()
    clock.now += 500  # time with a live owner does not count
    assert not owner.expired()
    clock.now += 59.9
    assert not owner.expired()
    clock.now += 0.1
    assert owner.expired()


def test_a_replica_that_cannot_be_adopted_yet_stops_as_soon_as_its_owner_is_gone():
    alive, loaded = {10}, []
    owner = OwnerWatch(10, 60.0, alive=lambda pid: pid in alive, clock=Clock(), adoptable=lambda: bool(loaded))
    assert not owner.expired()  # still loading, owner alive
    alive.clear()
    assert owner.expired()  # still loading, owner gone: not in any registry, nobody can adopt it
    loaded.append(True)
    assert not owner.expired()  # serving: it waits its grace for an adoption


def test_an_adoption_resets_the_grace_and_the_new_owner_is_watched():
    alive: set[int] = set()
    owner, clock = watch_with(alive)
    assert not owner.expired()
    clock.now += 30
    alive.add(20)
    assert owner.adopt(20)
    clock.now += 1000
    assert not owner.expired()
    alive.clear()  # the new owner dies too: a fresh grace
    assert not owner.expired()
    clock.now += 60
    assert owner.expired()


def test_a_replica_is_never_taken_from_a_living_owner():
    owner, _ = watch_with({10, 20})
    assert not owner.adopt(20)
    assert owner.owner_pid == 10
    assert owner.adopt(10)  # its own owner again: fine


def test_the_first_owner_is_the_named_gateway_else_the_parent():
    assert first_owner({"TOLLFREE_REPLICA_OWNER_PID": "4242"}) == 4242
    import os

    assert first_owner({}) == os.getppid()


async def _inner(scope, receive, send):  # type: ignore[no-untyped-def]
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_the_adopt_route_needs_the_token_a_pid_and_a_dead_owner():
    alive = {10}
    owner, _ = watch_with(alive)
    client = TestClient(Adoptable(_inner, owner, "replica-token"))
    good = {"Authorization": "Bearer replica-token"}
    assert client.post("/adopt", json={"owner_pid": 20}).status_code == 401
    assert client.post("/adopt", json={"owner_pid": "x"}, headers=good).status_code == 400
    refused = client.post("/adopt", json={"owner_pid": 20}, headers=good)
    assert refused.status_code == 409 and refused.json()["error_code"] == "RESOURCE_CONFLICT"
    alive.clear()
    assert client.post("/adopt", json={"owner_pid": 20}, headers=good).json() == {"owner_pid": 20}
    assert owner.owner_pid == 20
    assert client.get("/health/ready").status_code == 204  # everything else goes to the replica's app


def test_an_owner_killed_but_not_yet_reaped_by_its_parent_is_gone():
    owner = subprocess.Popen(["sleep", "60"])
    owner.kill()
    os.waitid(os.P_PID, owner.pid, os.WEXITED | os.WNOWAIT)  # exited, left a zombie: not reaped
    try:
        assert not pid_alive(owner.pid)
        assert pid_alive(os.getpid())
    finally:
        owner.wait()
    assert not pid_alive(owner.pid)
