"""The gateway's stream supervisor against a real redis-server: the leader runs one consumer per stream input of
its live endpoints, restarts it when its config changes, and stops them when the endpoint goes or this gateway
stops leading; each group's lag is read for the metrics and the autoscaler's signal (an entity's traffic share
of the backlog per second of ``max_lag_s``)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import redis

from infra.redis import RedisServer
from serving.endpoints.live import LiveEndpoint
from serving.gateway.streaming import StreamSupervisor
from serving.streams.broker import Lag
from serving.streams.config import StreamInput


@pytest.fixture
def server(stream_broker: RedisServer) -> RedisServer:
    return stream_broker


def _input(server: RedisServer, **extra: object) -> StreamInput:
    return StreamInput(
        source=f"{server.url}/in", sink=f"{server.url}/out", dead_letter=f"{server.url}/dead", group="g", **extra
    )  # type: ignore[arg-type]


def test_consumers_follow_the_live_configs_and_the_leadership_and_their_lag_is_read(server) -> None:  # type: ignore[no-untyped-def]
    client = redis.Redis(port=server.port)
    for i in range(30):
        client.xadd("in", {"x": str(i)})
    first = _input(server, max_lag_s=10.0)
    manager = SimpleNamespace(leading=True, live={"e": LiveEndpoint({}, [("a", 80), ("b", 20)], None, (first,))})

    async def run() -> None:
        supervisor = StreamSupervisor(manager, inference_log=None, consumer="c")  # type: ignore[arg-type]
        supervisor.sync()
        [(key, (config, consumer, task))] = supervisor.consumers.items()
        assert key == ("e", f"{server.url}/in", "g") and config == first
        deadline = asyncio.get_running_loop().time() + 10
        while consumer.stats.lag.pending != 30 or consumer.stats.retries == 0:  # no replica yet: read, and waiting
            assert asyncio.get_running_loop().time() < deadline, consumer.stats
            await supervisor.read_lag()
            await asyncio.sleep(0.05)
        assert consumer.stats.lag.entries == 30
        assert supervisor.backlog_per_s("e", "a") == 0.0  # in flight, not waiting: being served
        consumer.stats.lag = Lag(unread=30, pending=200, oldest_age_s=1.0)
        assert supervisor.backlog_per_s("e", "a") == pytest.approx(0.8 * 30 / 10.0)
        assert supervisor.backlog_per_s("e", "b") == pytest.approx(0.2 * 30 / 10.0)
        assert supervisor.backlog_per_s("other", "a") == 0.0

        changed = _input(server, max_lag_s=20.0)
        manager.live["e"] = LiveEndpoint({}, [("a", 100)], None, (changed,))
        supervisor.sync()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
        assert task.cancelled()
        [(_, (config, _, restarted))] = supervisor.consumers.items()
        assert config == changed and restarted is not task

        manager.leading = False  # another gateway leads now: it consumes
        supervisor.sync()
        assert supervisor.consumers == {}
        manager.leading = True
        manager.live.clear()  # the endpoint was deleted
        supervisor.sync()
        assert supervisor.consumers == {}
        await supervisor.stop()
        await asyncio.gather(restarted, return_exceptions=True)

    asyncio.run(run())
