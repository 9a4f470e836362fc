"""The servers the serving benchmark (benchmarks/serving.py) loads, one at a time: `mlflow models serve`
with 1 or 2 workers, and tollfree's gateway with one endpoint; each started, waited for and stopped."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 90.0
VENV_BIN = Path(sys.executable).parent


def throwaway_home(prefix: str) -> Path:
    """wrk installed (Debian's package, installed if missing and root), then a temporary ``TOLLFREE_HOME`` with a
    SQLite registry, set in this process's environment with the shipped defaults (telemetry off before MLflow
    is imported). The caller removes it."""
    from infra.packages import PackageMissing, ensure_binary

    try:
        ensure_binary("wrk", "wrk")
    except PackageMissing as exc:
        raise SystemExit(str(exc)) from exc
    home = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["TOLLFREE_HOME"] = str(home)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{home / 'mlflow.db'}"
    from serving.settings import export_defaults

    export_defaults(os.environ)
    (home / "logs").mkdir()
    return home


class Server:
    """A running server: where to send requests, which headers, which process tree to meter."""

    def __init__(
        self, kind: str, url: str, path: str, headers: dict[str, str], pid: int, stop: Callable[[], Any] | None
    ) -> None:
        self.kind, self.url, self.path, self.headers, self.pid, self._stop = kind, url, path, headers, pid, stop

    def stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            stop()


def wait_http_ok(url: str, process: subprocess.Popen, log_path: Path, timeout_s: float = READY_TIMEOUT_S) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode}; see {log_path}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not 200 after {timeout_s:.0f}s; see {log_path}")


def start_mlflow(model: dict[str, Any], workers: int, env: dict[str, str], logs: Path) -> Server:
    from serving.replicas.local import free_port

    port = free_port("127.0.0.1")
    log_path = logs / f"mlflow-{model['name']}-{workers}w.log"
    cmd = [
        str(VENV_BIN / "mlflow"),
        "models",
        "serve",
        "-m",
        f"models:/{model['name']}/{model['version']}",
        "--env-manager",
        "local",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    if workers != 1:
        cmd += ["-w", str(workers)]
    return start_session(f"mlflow-{workers}w", cmd, env, f"http://127.0.0.1:{port}", {}, log_path)


def start_session(
    kind: str, cmd: list[str], env: dict[str, str], url: str, headers: dict[str, str], log_path: Path
) -> Server:
    """``cmd`` in a session of its own (a CLI and the workers it starts), ready once ``url/ping`` answers 200;
    stopping it ends the whole session."""
    with open(log_path, "ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def stop() -> None:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # its own session: the CLI, uvicorn and its workers
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # stragglers left in the group

    try:
        wait_http_ok(f"{url}/ping", process, log_path)
    except BaseException:
        stop()
        raise
    return Server(kind, url, "/invocations", headers, process.pid, stop)


def create_bench_endpoint(url: str, token: str, model: dict[str, Any], entity: dict[str, Any]) -> None:
    """Endpoint ``bench`` serving ``model`` (its name and version; ``entity`` adds to the served entity), created
    through the gateway at ``url`` and waited for until ready."""
    import httpx

    from serving.gateway.process import wait_endpoint_ready

    served = {"entity_name": model["name"], "entity_version": model["version"], **entity}
    created = httpx.post(
        f"{url}/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
        json={"name": "bench", "config": {"served_entities": [served]}},
    )
    if created.status_code != 200:
        raise RuntimeError(f"endpoint create: {created.status_code} {created.text[:300]}")
    wait_endpoint_ready(url, token, "bench", timeout_s=READY_TIMEOUT_S)


def start_tollfree(
    model: dict[str, Any],
    env: dict[str, str],
    logs: Path,
    *,
    kind: str = "tollfree",
    entity: dict[str, Any] | None = None,
) -> Server:
    """The gateway and endpoint ``bench``; ``entity`` adds to its served entity (default: ``max_concurrency`` 64)."""
    import httpx

    from serving.gateway.process import start_gateway

    token = secrets.token_urlsafe(24)
    # no warm pool: nothing but the gateway and the endpoint's replica runs (max_concurrency 64 fixes one
    # replica's concurrency, so the autoscaler keeps the one replica at c <= 32)
    gateway = start_gateway(
        {**env, "TOLLFREE_TOKEN": token, "TOLLFREE_WARM_POOL": "0"},
        logs / f"gateway-{kind}-{model['name']}.log",
        timeout_s=READY_TIMEOUT_S,
    )
    auth = {"Authorization": f"Bearer {token}"}

    def stop() -> None:
        with contextlib.suppress(Exception):  # the home is shared between models: leave no endpoint to restore
            httpx.delete(f"{gateway.url}/api/2.0/serving-endpoints/bench", headers=auth, timeout=30)
        gateway.stop()

    try:
        create_bench_endpoint(gateway.url, token, model, {"max_concurrency": 64} if entity is None else entity)
    except BaseException:
        stop()
        raise
    return Server(kind, gateway.url, "/serving-endpoints/bench/invocations", auth, gateway.process.pid, stop)
