"""A gateway's scrape targets for Prometheus: what it lists, when it rewrites, what it removes."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

from serving.discovery import record_name, write_record
from serving.gateway.scrape_targets import ScrapeTargets, replica_groups
from serving.replicas.local import LocalReplica


class _Process:
    def __init__(self, pid: int, running: bool = True) -> None:
        self.pid, self.running = pid, running

    def poll(self) -> int | None:
        return None if self.running else -9


def _replica(port: int, running: bool = True) -> LocalReplica:
    return LocalReplica("models:/m/1", "127.0.0.1", port, _Process(1000 + port, running), Path(os.devnull))


def _set(version: str, replicas: list, followed: bool = False) -> SimpleNamespace:
    return SimpleNamespace(version=version, replicas=tuple(replicas), followed=followed)


def _live() -> dict:
    return {
        "fraud": SimpleNamespace(
            replica_sets={
                "main": _set("3", [_replica(9002), _replica(9001), _replica(9003, running=False)]),
                "canary": _set("4", [_replica(9004)]),
            }
        ),
        "followed": SimpleNamespace(replica_sets={"main": _set("1", [_replica(9005)], followed=True)}),
        "pods": SimpleNamespace(replica_sets={"main": _set("1", [SimpleNamespace(host="10.0.0.5", port=8080)])}),
    }


def test_each_entity_run_here_is_a_group_of_its_live_replicas_with_its_labels():
    groups = replica_groups(_live(), "vm-7")
    assert groups == [
        {
            "targets": ["127.0.0.1:9004"],
            "labels": {"endpoint": "fraud", "served_entity": "canary", "model_version": "4", "gateway": "vm-7"},
        },
        {
            "targets": ["127.0.0.1:9001", "127.0.0.1:9002"],
            "labels": {"endpoint": "fraud", "served_entity": "main", "model_version": "3", "gateway": "vm-7"},
        },
    ]  # the dead replica, the followed set (the leader lists it) and the pods are not this gateway's to list


def test_the_files_follow_the_gateway_record_and_its_replicas_and_go_at_its_stop(tmp_path):
    records, folder = tmp_path / "gateways", tmp_path / "prometheus" / "targets"
    live = _live()
    targets = ScrapeTargets(folder, records, lambda: live, pid=4242, alive=lambda pid: True)
    targets.refresh()
    assert not folder.exists() or not list(folder.iterdir())  # no record yet: nothing to list
    write_record(records, "http://127.0.0.1:8081", pid=4242, alive=lambda pid: True)
    targets.refresh()
    name = record_name(socket.gethostname(), 4242)
    gateway = folder / f"{name}.gateway.json"
    replicas = folder / f"{name}.replicas.json"
    assert json.loads(gateway.read_text()) == [{"targets": ["127.0.0.1:8081"], "labels": {"gateway": name}}]
    assert [g["labels"]["served_entity"] for g in json.loads(replicas.read_text())] == ["canary", "main"]
    written = replicas.stat().st_mtime_ns
    os.utime(replicas, ns=(written - 10**9, written - 10**9))
    targets.refresh()  # nothing changed: not rewritten (Prometheus re-reads a file on every write)
    assert replicas.stat().st_mtime_ns == written - 10**9
    del live["fraud"].replica_sets["canary"]
    targets.refresh()
    assert [g["labels"]["served_entity"] for g in json.loads(replicas.read_text())] == ["main"]
    targets.remove()
    assert not gateway.exists() and not replicas.exists()


def test_a_starting_gateway_removes_the_files_of_this_hosts_gateways_that_are_gone(tmp_path):
    folder = tmp_path / "targets"
    folder.mkdir()
    host = record_name(socket.gethostname(), 0).removesuffix("-0")
    gone = [folder / f"{host}-111.gateway.json", folder / f"{host}-111.replicas.json"]
    running = folder / f"{host}-222.gateway.json"
    elsewhere = folder / "another-host-111.gateway.json"
    for path in (*gone, running, elsewhere):
        path.write_text("[]\n")
    targets = ScrapeTargets(folder, tmp_path / "gateways", dict, pid=333, alive=lambda pid: pid == 222)

    async def start_and_stop() -> None:
        task = asyncio.get_running_loop().create_task(targets.run(interval_s=0.01))
        deadline = time.monotonic() + 10
        while any(p.exists() for p in gone) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(start_and_stop())
    assert not any(p.exists() for p in gone)
    assert running.exists() and elsewhere.exists()  # a live gateway's, and another host's (its pids mean nothing here)
