"""Real replica processes whose gateway is gone: a serving replica is adopted by a new owner (with the replica
token, once the old owner is dead) and lives on past its grace, and one nobody adopts stops itself after its
grace; a warm-pool standby (no model: nobody can adopt it) stops at once when its owner dies."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serving.replicas.local import free_port, process_running
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "orphan-test-replica-token"


def _replica(tmp_path: Path, owner_pid: int, grace_s: float, what: list[str]) -> tuple[subprocess.Popen, str]:
    """A replica process (``what``: ``--standby`` or ``--model-uri URI``) owned by ``owner_pid``, once it answers."""
    port = free_port()
    env = {
        **os.environ,
        "TOLLFREE_REPLICA_TOKEN": TOKEN,
        "TOLLFREE_REPLICA_OWNER_PID": str(owner_pid),
        "TOLLFREE_REPLICA_ORPHAN_S": str(grace_s),
    }
    with open(tmp_path / f"replica-{port}.log", "ab") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.replica_server", *what, "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    probe = "/health/live" if what == ["--standby"] else "/health/ready"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, (tmp_path / f"replica-{port}.log").read_text()
        try:
            if httpx.get(f"{url}{probe}", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "standby replica not live"
        time.sleep(0.1)


def _sleeper() -> subprocess.Popen:
    """A process to stand for a gateway: alive until killed."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def _log(tmp_path: Path) -> str:
    return next(tmp_path.glob("replica-*.log")).read_text()


def test_a_serving_replica_is_adopted_once_its_owner_is_dead_and_stops_after_its_grace_when_nobody_does(
    tmp_path, world
):
    owner, second = _sleeper(), _sleeper()
    process, url = _replica(tmp_path, owner.pid, 2, ["--model-uri", f"models:/{MODEL_NAME}/1"])
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        taken = httpx.post(f"{url}/adopt", json={"owner_pid": second.pid}, headers=headers, timeout=10)
        assert taken.status_code == 409  # its gateway is alive
        assert httpx.post(f"{url}/adopt", json={"owner_pid": second.pid}, timeout=10).status_code == 401
        owner.kill()
        owner.wait()
        assert (
            httpx.post(f"{url}/adopt", json={"owner_pid": second.pid}, headers=headers, timeout=10).status_code == 200
        )
        deadline = time.monotonic() + 5  # more than twice the grace: it must still be there
        while time.monotonic() < deadline:
            assert process.poll() is None and process_running(process.pid), "the adopted replica stopped"
            time.sleep(0.2)
        second.kill()  # its new owner dies too, and nobody adopts it: it stops after its grace
        second.wait()
        # a graceful stop (uvicorn re-raises the SIGTERM it sent itself once shut down), not a crash
        assert process.wait(timeout=30) in (0, -15)
        assert "waiting 2s to be adopted" in _log(tmp_path) and "ownerless and not adopted: stopping" in _log(tmp_path)
    finally:
        for proc in (owner, second, process):
            if proc.poll() is None:
                proc.kill()


def test_a_standby_stops_at_once_when_its_owner_dies(tmp_path):
    owner = _sleeper()
    process, _ = _replica(tmp_path, owner.pid, 60, ["--standby"])
    try:
        owner.kill()
        owner.wait()
        assert process.wait(timeout=15) in (0, -15)  # not the 60 s grace: no registry lists a standby
        assert "gone before this replica could serve" in _log(tmp_path)
    finally:
        for proc in (owner, process):
            if proc.poll() is None:
                proc.kill()
