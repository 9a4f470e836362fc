"""The leader lease on both stores: one holder at a time, renewal, expiry, a dead holder's lease taken at
once, a release, and many contenders racing for a free lease getting exactly one winner."""

from __future__ import annotations

import threading

from serving.state.lease import Lease


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
