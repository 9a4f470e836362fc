"""The gateway's fork server with real processes: replicas forked from it look and stop like spawned ones, cost
a fraction of the imports, outlive it, and a start falls back to a process of its own when it cannot fork."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from serving.protocol.wire import OWNER_ENV
from serving.replicas.forking import ForkServer
from serving.replicas.local import ForeignProcess, Launcher, is_replica_process, stop_replica, wait_live
from tests.gateways import command_words

pytestmark = pytest.mark.slow  # real fork server and replica processes


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _gone(pid: int, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_forked_replicas_look_like_spawned_ones_cost_a_fraction_of_the_imports_and_outlive_the_fork_server(tmp_path):
    launcher = Launcher.for_gateway(dict(os.environ), tmp_path / "logs")
    standbys = []
    try:
        launcher.prepare()
        server = launcher.fork_server
        assert server is not None and server.pid is not None
        for _ in range(2):
            standby = launcher.start("")
            wait_live(standby)
            standbys.append(standby)
        fork_server = psutil.Process(server.pid)
        for standby in standbys:
            process = psutil.Process(standby.pid)
            assert isinstance(standby.process, ForeignProcess) and process.ppid() == server.pid
            words = command_words(process)
            assert words[1:] == [
                "-m",
                "serving.replica_server",
                "--standby",
                "--host",
                "127.0.0.1",
                "--port",
                str(standby.port),
            ]
            assert is_replica_process(standby.pid, standby.port)
            assert os.getpgid(standby.pid) == standby.pid, "it leads its own process group, as a spawned one"
            assert process.environ().get(OWNER_ENV) == str(os.getpid())
        # the imports were paid once, by the fork server; the second standby paid only for its own start
        imports_s, second_s = _cpu_s(fork_server), _cpu_s(psutil.Process(standbys[1].pid))
        print(f"fork server {imports_s:.2f} CPU-s, a forked standby {second_s:.2f} CPU-s")
        assert second_s < imports_s / 2, (second_s, imports_s)

        launcher.close()  # the gateway's pipe closes: the fork server ends, its replicas live on
        assert _gone(fork_server.pid) and server.pid is None
        assert all(s.alive() for s in standbys)
        assert launcher.fork_server.fork(["--standby", "--port", "1"], tmp_path / "x.log") is None  # closed
    finally:
        for standby in standbys:
            stop_replica(standby)
        launcher.close()
    assert all(_gone(s.pid, 1.0) for s in standbys)


def test_a_killed_fork_server_is_replaced_and_one_that_cannot_start_leaves_starts_to_spawn(tmp_path):
    launcher = Launcher.for_gateway(dict(os.environ), tmp_path / "logs")
    never_ready = Launcher(
        tmp_path / "logs2", launcher.env, ForkServer(launcher.env, tmp_path / "logs2", ready_timeout_s=0.01)
    )
    replicas = []
    try:
        launcher.prepare()
        first = launcher.fork_server.pid
        os.kill(first, 9)
        replicas.append(launcher.start(""))  # at once: a new fork server forks it
        assert launcher.fork_server.pid not in (None, first) and _gone(first)
        assert isinstance(replicas[-1].process, ForeignProcess)
        assert psutil.Process(replicas[-1].pid).ppid() == launcher.fork_server.pid

        replicas.append(never_ready.start(""))  # the fork server was killed before its imports ended: spawned
        assert not isinstance(replicas[-1].process, ForeignProcess)
        assert psutil.Process(replicas[-1].pid).ppid() == os.getpid()
        wait_live(replicas[-1])
        assert not [
            c
            for c in psutil.Process().children()
            if "serving.replica_server.fork_server" in command_words(c)
            and c.pid != launcher.fork_server.pid
            and c.status() != psutil.STATUS_ZOMBIE
        ]
        assert never_ready.fork_server.fork(["--standby", "--port", "1"], tmp_path / "x.log") is None  # not retried
    finally:
        for replica in replicas:
            stop_replica(replica)
        launcher.close()
        never_ready.close()


def test_a_bad_request_gets_a_clear_error_bad_replica_arguments_end_in_its_log_and_the_end_of_its_pipe_ends_it(
    tmp_path,
):
    """The fork server's own protocol, driven by hand: what a broken caller gets, and how it ends."""
    server = subprocess.Popen(
        [sys.executable, "-m", "serving.replica_server.fork_server", " " * 256],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ),
    )
    try:
        assert json.loads(server.stdout.readline()) == {"ready": True}
        server.stdin.write(b'{"args": "not a list", "secret": "s3cr3t"\n')
        server.stdin.flush()
        answer = json.loads(server.stdout.readline())
        assert answer == {"error": "bad request: JSONDecodeError"}  # names what is wrong, echoes nothing

        log_path = tmp_path / "replica.log"
        server.stdin.write(json.dumps({"args": ["--standby"], "log": str(log_path)}).encode() + b"\n")  # no --port
        server.stdin.flush()
        pid = json.loads(server.stdout.readline())["pid"]
        assert _gone(pid)
        assert "the following arguments are required: --port" in log_path.read_text()

        server.stdin.close()  # its gateway went away
        assert server.wait(timeout=30) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
