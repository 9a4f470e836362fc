"""The embedded backend with real replica processes of the world's champion: a scale-down asked for while
replicas are still starting holds when they come up (none is left beyond the count asked for)."""

from __future__ import annotations

import asyncio
import os
import time

import psutil
from mlflow import MlflowClient

from serving.endpoints.manager import EndpointManager, LiveEndpoint
from serving.endpoints.store import EndpointStore
from serving.replicas.local import stop_replica
from serving.replicas.local_backend import LocalBackend
from serving.replicas.served_entity import ServedEntity
from tests.world import MODEL_NAME

KEY = ("scaled", "champion")


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE}


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
    before = _children()

    async def scenario() -> tuple[int, set[int], set[int]]:
        manager = EndpointManager(EndpointStore(tmp_path / "endpoints.db"), lambda *a: version, dict(os.environ),
                                  tmp_path / "logs", home=tmp_path)
        served = ServedEntity(name="champion", model_name=MODEL_NAME, version=version)
        manager.live[KEY[0]] = LiveEndpoint(entities={KEY[1]: served}, weights=[(KEY[1], 100)])
        backend = LocalBackend(manager.entity, manager.launcher)
        backend.set_replicas(*KEY, 3)
        backend.set_replicas(*KEY, 1)   # none is ready yet: the two extra ones are still starting
        await asyncio.sleep(0)          # the starts run: their processes exist
        spawned = _children() - before
        deadline = time.monotonic() + 180
        while backend.starting.get(KEY, 0) > 0:
            assert time.monotonic() < deadline, "the replicas never finished starting"
            await asyncio.sleep(0.2)
        ready = backend.ready_replicas(*KEY)
        kept = {r.pid for r in served.replicas}
        for replica in list(served.replicas):
            served.replicas.remove(replica)
            stop_replica(replica)
        await backend.close()
        return ready, kept, spawned

    ready, kept, spawned = asyncio.run(scenario())
    assert len(spawned) == 3, f"three replica processes started: {spawned}"
    assert ready == 1 and len(kept) == 1 and kept <= spawned
    assert _alive(spawned - kept) == set(), "the replicas that came up past the count were stopped"
