"""A replica set on the embedded backend, with real replica processes of the world's champion: a scale-down
asked for while replicas are still starting holds when they come up (none is left beyond the count asked for)."""

from __future__ import annotations

import asyncio
import os
import time

import psutil
import pytest
from mlflow import MlflowClient

from serving.replicas.local import Launcher
from serving.replicas.local_backend import LocalBackend
from serving.replicas.replica_set import ReplicaSet
from tests.gateways import replica_processes
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow  # real replica processes (each imports the serving runtime)


def _replicas() -> set[int]:
    return {p.pid for p in replica_processes(psutil.Process(), "--model-uri")}


def _alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.NoSuchProcess:
            continue
    return out


def test_a_scale_down_while_replicas_start_leaves_only_the_count_asked_for(world, tmp_path):
    version = str(MlflowClient(world.settings.tracking_uri).get_model_version_by_alias(MODEL_NAME, "champion").version)
    before = _replicas()

    async def scenario() -> tuple[int, set[int], set[int], set[int]]:
        backend = LocalBackend(Launcher.for_gateway(os.environ, tmp_path / "logs"))
        served = ReplicaSet("champion", MODEL_NAME, version, backend)
        served.scale_to(3)
        served.scale_to(1)  # none is ready yet: the two extra ones are still starting
        deadline = time.monotonic() + 180
        while len(spawned := _replicas() - before) < 3:  # the starts run: their processes exist
            assert time.monotonic() < deadline, f"three replica processes never started: {spawned}"
            await asyncio.sleep(0.05)
        while served.starting > 0:
            assert time.monotonic() < deadline, "the replicas never finished starting"
            await asyncio.sleep(0.2)
        ready = served.ready_count()
        kept = {r.pid for r in served.replicas}
        extras_alive = _alive(spawned - kept)
        await served.stop()
        await backend.close()
        backend.launcher.close()
        return ready, kept, spawned, extras_alive

    ready, kept, spawned, extras_alive = asyncio.run(scenario())
    assert len(spawned) == 3, f"three replica processes started: {spawned}"
    assert ready == 1 and len(kept) == 1 and kept <= spawned
    assert extras_alive == set(), "the replicas that came up past the count were stopped"
    assert _alive(spawned) == set(), "stop() stopped the one kept"
