"""The local stack's services: each one's command, environment and health check, from the stack's settings
(``infra.stack_config``).

What ``infra.stack`` starts, in one place: a Prefect server, an MLflow server on the state folder's
SQLite (unless ``MLFLOW_TRACKING_URI`` names an external one), the gateway, Prometheus scraping it and its
replicas (``infra.prometheus``), a Prefect process worker.
With ``TOLLFREE_GATEWAYS=N`` (N >= 2): N gateways on the ports after ``TOLLFREE_GATEWAY_PORT``, sharing a
PostgreSQL state store (the stack's own, ``infra.postgres``, unless ``TOLLFREE_STATE_URL`` names one), and
HAProxy on ``TOLLFREE_GATEWAY_PORT`` in front of them (``infra.haproxy``).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from infra import haproxy, prometheus
from infra.packages import ensure_haproxy, ensure_prometheus
from infra.postgres import run_as
from infra.processes import MARK, ProcessRecord
from infra.redis import answers as redis_answers
from infra.redis import redis_command
from infra.stack_config import HOST, StackConfig
from serving.settings import export_defaults

log = logging.getLogger("tollfree.stack")
PROJECT_DIR = Path(__file__).resolve().parent.parent
WORK_POOL = "tollfree-local"
STARTUP_TIMEOUT_S = float(os.environ.get("TOLLFREE_STACK_TIMEOUT_S", "180"))


@dataclass(frozen=True)
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int | None
    healthy: Callable[[httpx.Client], bool]
    url: str | None = None
    user: str | None = None  # run as this user (PostgreSQL refuses root)
    prepare: Callable[[], None] | None = None  # before it starts: its data folder, its config file


def _answers(url: str) -> Callable[[httpx.Client], bool]:
    def check(client: httpx.Client) -> bool:
        try:
            return client.get(url).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def worker_online(config: StackConfig, client: httpx.Client) -> bool:
    try:
        answer = client.post(f"{config.prefect_api}/work_pools/{WORK_POOL}/workers/filter", json={})
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and any(w.get("status") == "ONLINE" for w in answer.json())


def child_environ(config: StackConfig, environ: Mapping[str, str], stack_id: str, token: str) -> dict[str, str]:
    """What every process of the stack (and every flow run and replica they start) sees."""
    env = dict(environ)
    export_defaults(env)
    bin_dir = str(Path(sys.executable).parent)  # mlflow and prefect start helpers found on PATH
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(
        {
            MARK: stack_id,
            "TOLLFREE_HOME": str(config.home),
            "TOLLFREE_TOKEN": token,
            "TOLLFREE_GATEWAY_URL": config.url("gateway"),
            "MLFLOW_TRACKING_URI": config.tracking_uri,
            "PREFECT_API_URL": config.prefect_api,
            "PREFECT_HOME": str(config.home / "prefect"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "5")
    return env


def services(config: StackConfig, env: Mapping[str, str]) -> list[Service]:
    """Every service of the stack, in the order they start."""
    py = sys.executable
    out = [
        Service(
            "prefect-server",
            [py, "-m", "prefect", "server", "start", "--host", HOST, "--port", str(config.ports["prefect"])],
            dict(env),
            config.ports["prefect"],
            _answers(f"{config.prefect_api}/health"),
            config.url("prefect"),
        )
    ]
    if config.backend_store_uri is not None:
        out.append(_mlflow_server(config, config.backend_store_uri, env))
    redis_port = config.ports["redis"]
    redis_dir = config.home / "redis"
    out.append(
        Service(
            "redis",
            redis_command(redis_port, redis_dir),
            dict(env),
            redis_port,
            lambda client: redis_answers(redis_port),
            f"redis://{HOST}:{redis_port}",
            prepare=lambda: redis_dir.mkdir(parents=True, exist_ok=True),
        )
    )
    out.extend(_gateway_services(config, env))
    out.append(_prometheus(config, env))
    out.append(
        Service(
            "stream-feed",
            [py, "-m", "infra.stream_feed"],
            {**env, "TOLLFREE_REDIS_PORT": str(redis_port)},
            None,
            lambda client: True,
        )
    )
    worker = ["--pool", WORK_POOL, "--type", "process", "--name", f"{WORK_POOL}-worker", "--install-policy", "never"]
    out.append(
        Service(
            "worker",
            [py, "-m", "prefect", "worker", "start", *worker],
            dict(env),
            None,
            lambda client: worker_online(config, client),
        )
    )
    return out


def _mlflow_server(config: StackConfig, backend_store_uri: str, env: Mapping[str, str]) -> Service:
    """The local MLflow server (tracking, registry, UI) on ``backend_store_uri``, artifacts in the state folder."""
    mlflow_env = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
    # MLflow's server-side job runner (huey) serves GenAI jobs tollfree does not use; it also outlives SIGTERM.
    mlflow_env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    listen = ["--host", HOST, "--port", str(config.ports["mlflow"])]
    stores = ["--backend-store-uri", backend_store_uri, "--artifacts-destination", str(config.home / "mlartifacts")]
    return Service(
        "mlflow-server",
        [sys.executable, "-m", "mlflow", "server", *listen, *stores, "--workers", "1"],
        mlflow_env,
        config.ports["mlflow"],
        _answers(f"{config.url('mlflow')}/health"),
        config.url("mlflow"),
    )


def _prometheus(config: StackConfig, env: Mapping[str, str]) -> Service:
    """Prometheus over what the gateways list for it, with the rules of ``infra/prometheus/rules.yml``."""
    folder = config.home / "prometheus"
    cfg = config.state_dir / "prometheus.yml"
    token_file = config.home / "secrets" / "scrape-token"

    def prepare() -> None:
        (folder / "targets").mkdir(parents=True, exist_ok=True)
        prometheus.write_secret(token_file, env["TOLLFREE_TOKEN"])
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(prometheus.config(folder / "targets", token_file, config.home / "replica.token"))

    port = config.ports["prometheus"]
    return Service(
        "prometheus",
        prometheus.command(ensure_prometheus(), cfg, folder / "data", HOST, port),
        dict(env),
        port,
        _answers(f"{config.url('prometheus')}/-/ready"),
        config.url("prometheus"),
        prepare=prepare,
    )


def _gateway_services(config: StackConfig, env: Mapping[str, str]) -> list[Service]:
    """One gateway; or PostgreSQL (unless the user gave a state URL), N gateways on it, and HAProxy."""
    py = sys.executable
    if config.gateways == 1:
        return [
            Service(
                "gateway",
                [py, "-m", "serving", "--host", HOST, "--port", str(config.ports["gateway"])],
                dict(env),
                config.ports["gateway"],
                _answers(f"{config.url('gateway')}/healthz"),
                config.url("gateway"),
            )
        ]
    out = []
    gateway_env = dict(env)
    # the gateways would all ask for one gRPC port, and HAProxy here carries HTTP/1.1 only: gRPC is for one gateway
    gateway_env.pop("TOLLFREE_GRPC_PORT", None)
    pg = config.postgres
    if pg is not None:
        gateway_env["TOLLFREE_STATE_URL"] = pg.url()
        out.append(
            Service(
                "postgres",
                pg.command(),
                dict(env),
                pg.port,
                lambda client: pg.answers(),
                pg.shown,
                run_as(),
                prepare=pg.initialize,
            )
        )
    for i, port in enumerate(config.gateway_ports(), 1):
        url = f"http://{HOST}:{port}"
        out.append(
            Service(
                f"gateway-{i}",
                [py, "-m", "serving", "--host", HOST, "--port", str(port)],
                gateway_env,
                port,
                _answers(f"{url}/healthz"),
                url,
            )
        )
    cfg = config.state_dir / "haproxy.cfg"

    def write_config() -> None:
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(haproxy.config(config.ports["gateway"], config.gateway_ports(), HOST))

    out.append(
        Service(
            "haproxy",
            [ensure_haproxy(), "-f", str(cfg), "-db"],
            dict(env),
            config.ports["gateway"],
            _answers(f"{config.url('gateway')}/healthz"),
            config.url("gateway"),
            prepare=write_config,
        )
    )
    return out


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers do: TIME_WAIT is no conflict
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def wait_healthy(pending: list[tuple[Service, ProcessRecord]], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=3.0) as client:
        while pending:
            for service, record in list(pending):
                if not record.alive():
                    raise RuntimeError(f"{service.name} exited during start-up; see {record.log}")
                if service.healthy(client):
                    log.info("%s is up (pid %d)", service.name, record.pid)
                    pending.remove((service, record))
            if pending and time.monotonic() > deadline:
                names = ", ".join(s.name for s, _ in pending)
                raise RuntimeError(f"not healthy after {timeout_s:.0f}s: {names}; see {config_logs(pending)}")
            time.sleep(0.25)


def config_logs(pending: list[tuple[Service, ProcessRecord]]) -> str:
    return ", ".join(r.log for _, r in pending)
