"""Real standby replica processes whose gateway is gone: one nobody adopts stops itself after its grace; one
adopted by a new owner (with the replica token, once the old owner is dead) lives on past it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from serving.replicas.local import free_port, process_running

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "orphan-test-replica-token"


def _standby(tmp_path: Path, owner_pid: int, grace_s: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "TOLLFREE_REPLICA_TOKEN": TOKEN, "TOLLFREE_REPLICA_OWNER_PID": str(owner_pid),
           "TOLLFREE_REPLICA_ORPHAN_S": str(grace_s)}
    out = open(tmp_path / f"replica-{port}.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "serving.replica", "--standby", "--port", str(port)],
                               cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, (tmp_path / f"replica-{port}.log").read_text()
        try:
            if httpx.get(f"{url}/health/live", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "standby replica not live"
        time.sleep(0.1)


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def test_an_orphan_nobody_adopts_stops_itself_after_its_grace(tmp_path):
    process, _ = _standby(tmp_path, _dead_pid(), grace_s=2)
    try:
        # a graceful stop (uvicorn re-raises the SIGTERM it sent itself once shut down), not a crash
        assert process.wait(timeout=30) in (0, -15)
        assert "not adopted within 2s" in next(tmp_path.glob("replica-*.log")).read_text()
    finally:
        if process.poll() is None:
            process.kill()


def test_an_adopted_orphan_lives_on_and_a_living_owner_keeps_its_replica(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    process, url = _standby(tmp_path, owner.pid, grace_s=2)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        taken = httpx.post(f"{url}/adopt", json={"owner_pid": os.getpid()}, headers=headers, timeout=10)
        assert taken.status_code == 409  # its gateway is alive
        assert httpx.post(f"{url}/adopt", json={"owner_pid": os.getpid()}, timeout=10).status_code == 401
        owner.kill()
        owner.wait()
        assert httpx.post(f"{url}/adopt", json={"owner_pid": os.getpid()}, headers=headers, timeout=10).status_code == 200
        deadline = time.monotonic() + 5  # more than twice the grace: it must still be there
        while time.monotonic() < deadline:
            assert process.poll() is None and process_running(process.pid), "the adopted replica stopped"
            time.sleep(0.2)
    finally:
        owner.kill()
        process.terminate()
        process.wait(timeout=30)
