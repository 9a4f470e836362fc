"""The leader lease on both stores: one holder at a time, renewal, expiry, a dead holder's lease taken at
once, a release, and many contenders racing for a free lease getting exactly one winner; the term as a fencing
token: a leader whose lease another took writes nothing, while it is held by PostgreSQL a takeover waits for a
leader's write in flight."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import select

from serving.state.lease import Fence, Lease, StaleLeader
from serving.state.replica_table import ReplicaRow, ReplicaTable
from serving.state.schema import replicas


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_holder_until_it_expires_and_the_term_counts_holders(state_database) -> None:
    clock = Clock()
    lease = Lease(state_database, ttl_s=10, clock=clock)
    assert lease.hold("a") == 1
    assert lease.hold("b") is None
    clock.now += 8
    assert lease.hold("a") == 1  # renewed: now valid until +18
    clock.now += 9
    assert lease.hold("b") is None
    clock.now += 2  # a stopped renewing 11 s ago
    assert lease.hold("b") == 2
    assert lease.hold("a") is None
    assert lease.holder()[0] == "b"


def test_a_dead_holder_is_replaced_at_once_and_a_release_frees_it(state_database) -> None:
    clock = Clock()
    dead: set[str] = set()
    lease = Lease(state_database, ttl_s=10, clock=clock, is_gone=lambda holder: holder in dead)
    assert lease.hold("a") == 1
    dead.add("a")
    assert lease.hold("b") == 2
    lease.release("a")  # not the holder any more: changes nothing
    assert lease.hold("c") is None
    lease.release("b")
    assert lease.hold("c") == 3


def test_contenders_for_a_free_lease_get_exactly_one_winner(state_database) -> None:
    lease = Lease(state_database, ttl_s=10)
    barrier = threading.Barrier(6)
    won: list[str] = []
    errors: list[BaseException] = []

    def contend(name: str) -> None:
        barrier.wait()
        try:
            if lease.hold(name) is not None:
                won.append(name)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend, args=(f"g{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == [] and len(won) == 1 and lease.holder()[0] == won[0]


def _row(port: int, owner: int) -> ReplicaRow:
    return ReplicaRow(
        f"local:127.0.0.1:{port}:{port}", "127.0.0.1", port, port, "ep", "m-1", "models:/m/1", "local", 1.0, owner
    )


def test_a_leader_whose_lease_was_taken_writes_nothing(state_database) -> None:
    clock = Clock()
    lease = Lease(state_database, ttl_s=10, clock=clock)
    old, new = Fence(), Fence()
    old.hold("a", lease.hold("a"))
    ReplicaTable(state_database, old).replace("ep", "m-1", "models:/m/1", 1, [_row(9001, 1)])  # its term: written
    clock.now += 11  # "a" lost touch with the store and its lease ran out; "b" takes it over
    new.hold("b", lease.hold("b"))
    with pytest.raises(StaleLeader):
        ReplicaTable(state_database, old).replace("ep", "m-1", "models:/m/1", 1, [])
    with pytest.raises(StaleLeader):
        ReplicaTable(state_database, old).forget([_row(9001, 1)])
    ReplicaTable(state_database, new).replace("ep", "m-1", "models:/m/1", 2, [_row(9002, 2)])
    assert sorted(r.port for r in ReplicaTable(state_database).all()) == [9001, 9002]  # a's row stayed as it was
    old.drop()  # "a" noticed: it follows, and its writes are refused until it leads again
    with pytest.raises(StaleLeader):
        ReplicaTable(state_database, old).forget([_row(9002, 2)])
    assert Fence().armed is False  # one gateway on SQLite arms no fence: its writes are not checked


def test_on_postgresql_a_takeover_waits_for_the_leaders_write_in_flight(postgres) -> None:
    from serving.endpoints.store import EndpointStore

    database = EndpointStore(postgres.url(postgres.new_database())).database
    clock = Clock()
    lease = Lease(database, ttl_s=10, clock=clock)
    fence = Fence()
    fence.hold("a", lease.hold("a"))
    clock.now += 11
    taken: list[float] = []
    with database.engine.begin() as db:  # the leader's write, its lease checked and its row locked
        fence.check(db)
        taker = threading.Thread(target=lambda: taken.append(lease.hold("b") or 0))
        taker.start()
        taker.join(1.0)  # the window under test: the takeover is held while the write is open
        assert taker.is_alive(), "the takeover did not wait for the write in flight"
        db.execute(replicas.insert().values(**_row(9003, 1).__dict__))
    taker.join(10)
    assert taken == [2]  # then the takeover went through
    with database.engine.connect() as db:
        assert db.execute(select(replicas.c.port)).scalars().all() == [9003]
