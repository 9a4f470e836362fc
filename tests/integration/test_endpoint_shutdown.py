"""A gateway stopped (or an endpoint deleted) while a rollout is still starting replicas leaves no replica
process behind: the cancelled rollout stops what it started before shutdown returns. Real replica
processes, the manager driven on its own event loop."""

from __future__ import annotations

import asyncio
import os
import time

import psutil
import pytest

from serving.endpoints import spec
from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from tests.gateways import replica_processes

MODEL = "no-such-model"  # never loads in time: the replica is still starting when the gateway stops


def _replicas() -> list[psutil.Process]:
    """This test's replicas: the manager's own (forked by its fork server) serving MODEL (other tests' gateways
    have replicas too)."""
    return replica_processes(psutil.Process(), f"models:/{MODEL}/1")


async def _until_spawned(timeout_s: float = 30.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while not _replicas():
        assert time.monotonic() < deadline, "the rollout never started a replica"
        await asyncio.sleep(0.05)
    return _replicas()


def _manager(tmp_path) -> EndpointManager:
    return EndpointManager(
        EndpointStore(tmp_path / "endpoints.db"), lambda *a: "1", dict(os.environ), tmp_path / "logs", home=tmp_path
    )


def _request(name: str) -> spec.CreateEndpointRequest:
    return spec.CreateEndpointRequest.model_validate(
        {"name": name, "config": {"served_entities": [{"entity_name": MODEL, "entity_version": "1"}]}}
    )


@pytest.mark.parametrize("how", ["shutdown", "delete"])
def test_a_rollout_cancelled_while_its_replica_starts_leaves_no_process(tmp_path, how):
    async def scenario() -> tuple[list[psutil.Process], psutil.Process]:
        manager = _manager(tmp_path)
        await manager.open()
        await manager.endpoints.create(_request("starting"), "test")
        spawned = await _until_spawned()
        fork_server = psutil.Process(manager.launcher.fork_server.pid)
        if how == "delete":
            await manager.endpoints.delete("starting")
        await manager.shutdown()
        return spawned, fork_server

    spawned, fork_server = asyncio.run(scenario())
    assert spawned and all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in spawned)
    assert _replicas() == []
    assert not fork_server.is_running(), "the manager's fork server ends with it"


def test_endpoints_restored_at_start_and_stopped_at_once_leave_no_process(tmp_path):
    async def create_then_stop() -> None:
        manager = _manager(tmp_path)
        await manager.open()
        await manager.endpoints.create(_request("restored"), "test")
        await _until_spawned()
        await manager.shutdown()

    async def restore_then_stop() -> list[psutil.Process]:
        manager = _manager(tmp_path)  # the same store: the endpoint comes back up at start
        await manager.open()
        await manager.reconciler.restore()
        spawned = await _until_spawned()
        await manager.shutdown()
        return spawned

    asyncio.run(create_then_stop())
    spawned = asyncio.run(restore_then_stop())
    assert spawned and _replicas() == []
