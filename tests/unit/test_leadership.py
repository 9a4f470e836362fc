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
