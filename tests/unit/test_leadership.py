"""A leader that cannot renew its lease (the store down, or cut off from it) leads on only while the lease it last
renewed is surely its own, then follows with its writes fenced off; the clock and the lease are fakes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from serving.gateway.leadership import Leadership
from serving.state.lease import Fence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class StoreDown(Exception):
    pass


class FakeLease:
    ttl_s = 10.0

    def __init__(self) -> None:
        self.down = False

    def hold(self, holder: str) -> int | None:
        if self.down:
            raise StoreDown("connection refused")
        return 7

    def holder(self) -> tuple[str, float, int] | None:
        return None


class FakeReconciler:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def reconcile(self) -> None:
        self.calls.append("reconcile")

    async def follow(self) -> None:
        self.calls.append("follow")

    async def lead(self) -> None:
        self.calls.append("lead")


def test_a_leader_that_cannot_renew_follows_before_its_lease_can_run_out_elsewhere():
    clock = Clock()
    manager = SimpleNamespace(
        store=SimpleNamespace(database=None), leading=True, fence=Fence(), reconciler=FakeReconciler()
    )
    roles: list[bool] = []
    leadership = Leadership(manager, ttl_s=10.0, interval_s=0.5, on_role=roles.append, clock=clock)  # type: ignore[arg-type]
    lease = FakeLease()
    leadership.lease = lease  # type: ignore[assignment]

    async def scenario() -> list[tuple[bool, int | None]]:
        seen = []
        await leadership.step()  # renewed at 100: surely its own until 100 + 10 - 0.5
        seen.append((manager.leading, manager.fence.term))
        lease.down = True
        clock.now = 109.4
        await leadership.step()  # not renewed, but the lease cannot have run out yet
        seen.append((manager.leading, manager.fence.term))
        clock.now = 109.6
        await leadership.step()  # it may run out before the next step: follow now
        seen.append((manager.leading, manager.fence.term))
        return seen

    seen = asyncio.run(scenario())
    assert seen == [(True, 7), (True, 7), (False, None)]
    assert roles == [False] and manager.fence.armed  # its writes are refused until it holds the lease again
    assert manager.reconciler.calls == ["reconcile", "reconcile", "follow"]


class HangingLease(FakeLease):
    """A store on a cut network: the renewal waits, unanswered, until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.answer = threading.Event()
        self.hang = False

    def hold(self, holder: str) -> int | None:
        if self.hang:
            self.answer.wait(timeout=30)
        return 7


def _leader(clock: Clock, lease: FakeLease):  # type: ignore[no-untyped-def]
    manager = SimpleNamespace(
        store=SimpleNamespace(database=None), leading=True, fence=Fence(), reconciler=FakeReconciler()
    )
    roles: list[bool] = []
    leadership = Leadership(manager, ttl_s=10.0, interval_s=0.05, on_role=roles.append, clock=clock)  # type: ignore[arg-type]
    leadership.lease = lease  # type: ignore[assignment]
    return leadership, manager, roles


def test_a_renewal_that_hangs_does_not_keep_a_leader_leading_past_its_lease():
    clock, lease = Clock(), HangingLease()
    leadership, manager, roles = _leader(clock, lease)

    async def scenario() -> tuple[bool, bool]:
        await leadership.step()  # renewed at 100: its own until 100 + 10 - 0.05
        watchdog = asyncio.create_task(leadership._watch())
        lease.hang = True
        step = asyncio.create_task(leadership.step())  # the renewal waits on the cut network
        await asyncio.sleep(0.05)
        still_before = manager.leading
        clock.now = 109.96  # the lease it renewed last may now be another's
        deadline = asyncio.get_running_loop().time() + 5
        while manager.leading and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        stepped_down = not manager.leading
        lease.answer.set()
        await step
        watchdog.cancel()
        return still_before, stepped_down

    still_before, stepped_down = asyncio.run(scenario())
    assert still_before and stepped_down, "the leader led on while its renewal hung past the lease's validity"
    assert roles == [False] and manager.fence.term is None


def test_a_renewal_answered_only_after_its_validity_renews_nothing():
    clock, lease = Clock(), HangingLease()
    leadership, manager, roles = _leader(clock, lease)
    manager.leading = False

    class Late(HangingLease):
        def hold(self, holder: str) -> int | None:
            clock.now += 10.0  # the answer came 10 s after it was asked for: a TTL's worth
            return 7

    leadership.lease = Late()  # type: ignore[assignment]
    asyncio.run(leadership.step())
    assert not manager.leading and roles == []
    assert manager.reconciler.calls == ["follow"]
