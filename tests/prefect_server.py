"""The session's Prefect API: one real server shared by every xdist worker of a test run.

It runs what ``prefect.testing.utilities.prefect_test_harness`` runs: Prefect's own server app under uvicorn in
its ephemeral mode (the event, trigger, automation and task-run services; no UI, no scheduler) on a throw-away
SQLite database, on a free loopback port. The harness starts one per process, so with xdist one per worker;
each start costs about 9 CPU-seconds on the 2-core machine (5 of them the database's migrations, 1.6 the block
types' registration, which no test reads) and each idle server 0.7 CPU-seconds a minute. So the
pytest process that hands out the tests starts it once, before its workers exist, and they inherit its
``PREFECT_API_URL``; a run without workers starts it on first use. Tests tell their flows, events and
artifacts apart by their own names and resource ids, as they would on any shared Prefect server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from serving.replicas.local import free_port

# What Prefect's SubprocessASGIServer (the harness's server) sets for it, plus: no block types registered.
_SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
}


class PrefectServer:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> PrefectServer:
        """Start the server and return at once (``wait_ready`` waits for it)."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
        env.update(_SERVER_ENV)
        env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = f"sqlite+aiosqlite:///{self.home / 'prefect-test.db'}"
        with open(self.home / "prefect-server.log", "ab") as log:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "--factory",
                    "prefect.server.api.server:create_app",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--log-level",
                    "error",
                    "--lifespan",
                    "on",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        return self

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()


def wait_ready(api_url: str, timeout_s: float = 120.0) -> None:
    """Return once the server at ``api_url`` answers its health check; raise naming the URL after ``timeout_s``
    (a server that is still migrating its database on a busy machine takes several seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{api_url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the session's Prefect server at {api_url} did not answer within {timeout_s:.0f} s "
                "(its output: prefect-server/prefect-server.log in the test session's folder, kept "
                "with TOLLFREE_KEEP_TEST_STATE=1)"
            )
        time.sleep(0.2)
