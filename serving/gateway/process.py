"""Run the gateway as a child process (``python -m serving``): for the demo, the local stack and tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from serving.replicas.local import free_port
from serving.settings import PROJECT_DIR


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self, grace_s: float = 30.0) -> int:
        """SIGTERM (graceful: replicas stopped, inference log flushed), SIGKILL after ``grace_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return int(self.process.returncode)


def start_gateway(
    env: Mapping[str, str],
    log_path: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    timeout_s: float = 60.0,
    runner: Sequence[str] = (),
) -> GatewayProcess:
    """``python -m serving`` on ``host:port`` (a free port if None), run under ``runner`` if given (a command that
    execs the rest, as ``ip netns exec NAME`` does); returns once it answers ``/healthz``."""
    port = port or free_port(host)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [*runner, sys.executable, "-m", "serving", "--host", host, "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=str(PROJECT_DIR),
        )
    gateway = GatewayProcess(process, f"http://{host}:{port}", log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with code {process.returncode}; see {log_path}")
        try:
            if httpx.get(f"{gateway.url}/healthz", timeout=1.0).status_code == 200:
                return gateway
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    gateway.stop()
    raise RuntimeError(f"gateway not healthy after {timeout_s:.0f}s; see {log_path}")


def _poll_endpoint(
    url: str, token: str, name: str, done: Callable[[dict], bool], timeout_s: float, waiting: str
) -> dict:
    """The endpoint's view once ``done(view)``; TimeoutError naming what it was still ``waiting`` for."""
    deadline = time.monotonic() + timeout_s
    headers = {"Authorization": f"Bearer {token}"}
    while time.monotonic() < deadline:
        view = httpx.get(f"{url}/api/2.0/serving-endpoints/{name}", headers=headers, timeout=5).json()
        if done(view):
            return view
        time.sleep(0.3)
    raise TimeoutError(f"endpoint {name} {waiting} after {timeout_s:.0f}s")


def wait_endpoint_ready(url: str, token: str, name: str, timeout_s: float = 180.0) -> dict:
    """Poll the endpoint until READY / NOT_UPDATING; raise naming the state message if the rollout failed."""

    def ready(view: dict) -> bool:
        state = view.get("state", {})
        if state.get("config_update") == "UPDATE_FAILED":
            raise RuntimeError(f"endpoint {name} failed to deploy: {view.get('state_message') or state}")
        return state.get("ready") == "READY" and state.get("config_update") == "NOT_UPDATING"

    return _poll_endpoint(url, token, name, ready, timeout_s, "not ready")


def wait_endpoint_settled(url: str, token: str, name: str, timeout_s: float = 180.0) -> dict:
    """Poll the endpoint until no config update is in progress (a gateway that restarts on existing state restores
    each endpoint as an update, and a config change sent meanwhile is a 409, as Databricks answers)."""
    return _poll_endpoint(
        url,
        token,
        name,
        lambda view: view.get("state", {}).get("config_update") != "IN_PROGRESS",
        timeout_s,
        "still updating",
    )


def environ_with(overrides: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(overrides)
    return env
