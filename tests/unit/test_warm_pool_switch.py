"""The warm pool follows the lead: filled when a gateway starts leading, emptied when it stops (a follower
starts no replica), none at all with size 0. The pool itself is replaced by a recorder (no process starts)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import ClassVar

import serving.gateway.lifespan as gateway_lifespan
from tests.waiting import until_async


class RecordingPool:
    made: ClassVar[list[RecordingPool]] = []

    def __init__(self, size: int, launcher: object) -> None:
        self.size, self.filled, self.closed = size, 0, 0
        RecordingPool.made.append(self)

    def fill(self) -> None:
        self.filled += 1

    def close(self) -> None:
        self.closed += 1


def test_the_pool_is_the_leaders(monkeypatch):
    monkeypatch.setattr(gateway_lifespan, "WarmPool", RecordingPool)
    RecordingPool.made.clear()
    manager = SimpleNamespace(backend=SimpleNamespace(pool=None), launcher=object())

    async def scenario() -> None:
        switch = gateway_lifespan.WarmPoolSwitch(manager, 2)
        switch.switch(False)  # a follower: no pool
        assert manager.backend.pool is None
        switch.switch(True)  # takes the lead: a pool of 2, filling
        switch.switch(True)  # still leading: the same pool
        await until_async(lambda: RecordingPool.made and RecordingPool.made[0].filled, "the pool filled")
        assert len(RecordingPool.made) == 1 and manager.backend.pool is RecordingPool.made[0]
        assert RecordingPool.made[0].size == 2 and RecordingPool.made[0].filled == 1
        switch.switch(False)  # loses the lead: the pool's standbys stop
        await until_async(lambda: RecordingPool.made[0].closed, "the pool closed")
        assert manager.backend.pool is None and RecordingPool.made[0].closed == 1
        gateway_lifespan.WarmPoolSwitch(manager, 0).switch(True)
        assert manager.backend.pool is None  # size 0: no pool at all

    asyncio.run(scenario())
