"""The local stack's services and settings: ports, URLs, the admin token, each service's command and health.

What ``infra.stack`` starts, in one place: a Prefect server, an MLflow server on the state folder's
SQLite (unless ``MLFLOW_TRACKING_URI`` names an external one), the gateway, a Prefect process worker.
With ``TOLLFREE_GATEWAYS=N`` (N >= 2): N gateways on the ports after ``TOLLFREE_GATEWAY_PORT``, sharing a
PostgreSQL state store (the stack's own, ``infra.postgres``, unless ``TOLLFREE_STATE_URL`` names one), and
HAProxy on ``TOLLFREE_GATEWAY_PORT`` in front of them (``infra.haproxy``).
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from infra import haproxy
from infra.packages import ensure_haproxy
from infra.postgres import StackPostgres, run_as
from infra.processes import MARK, ProcessRecord
from infra.redis import answers as redis_answers
from infra.redis import redis_command
from serving.settings import export_defaults

log = logging.getLogger("tollfree.stack")
PROJECT_DIR = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
WORK_POOL = "tollfree-local"
PORT_DEFAULTS = {
    "prefect": ("TOLLFREE_PREFECT_PORT", 4200),
    "mlflow": ("TOLLFREE_MLFLOW_PORT", 5000),
    "gateway": ("TOLLFREE_GATEWAY_PORT", 8080),
    "redis": ("TOLLFREE_REDIS_PORT", 6380),
}
DATABASE_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql"}
MAX_GATEWAYS = 16
STARTUP_TIMEOUT_S = float(os.environ.get("TOLLFREE_STACK_TIMEOUT_S", "180"))


@dataclass(frozen=True)
class StackConfig:
    home: Path
    ports: dict[str, int]
    backend_store_uri: str | None  # the database behind a local MLflow server; None when MLflow is external
    external_tracking_uri: str | None
    token_from_env: bool
    seed_data: bool
    gateways: int = 1  # TOLLFREE_GATEWAYS
    state_url: str | None = None  # TOLLFREE_STATE_URL as set by the user
    postgres_port: int = 5433  # the stack's own PostgreSQL (several gateways, no state URL given)
    postgres_dir: Path | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> StackConfig:
        env = dict(environ)
        user_uri = env.get("MLFLOW_TRACKING_URI") or None
        settings = export_defaults(env)  # on a copy: the state folder made absolute, defaults filled in
        ports = {}
        for name, (var, default) in PORT_DEFAULTS.items():
            raw = env.get(var) or str(default)
            if not raw.isdigit() or not 0 < int(raw) < 65536:
                raise ValueError(f"{var} must be a TCP port, got {raw!r}")
            ports[name] = int(raw)
        own_server = f"http://{HOST}:{ports['mlflow']}"
        if user_uri is not None and user_uri.rstrip("/") == own_server:
            user_uri = None  # the stack's own env file was sourced: that is our server, not an external one
        # A database URI gets a local MLflow server in front of it; a server URI (http, databricks) is used as is.
        local = user_uri is None or user_uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES
        gateways = _gateways(env.get("TOLLFREE_GATEWAYS"))
        state_url = env.get("TOLLFREE_STATE_URL") or None
        if gateways > 1 and state_url is not None and not state_url.startswith("postgresql"):
            raise ValueError(
                "TOLLFREE_GATEWAYS above 1 needs a PostgreSQL state store: point TOLLFREE_STATE_URL at "
                "postgresql://..., or unset it and make up starts one"
            )
        raw_pg = env.get("TOLLFREE_POSTGRES_PORT") or "5433"
        if not raw_pg.isdigit() or not 0 < int(raw_pg) < 65536:
            raise ValueError(f"TOLLFREE_POSTGRES_PORT must be a TCP port, got {raw_pg!r}")
        if gateways > 1 and ports["gateway"] + gateways >= 65536:
            raise ValueError(
                f"TOLLFREE_GATEWAY_PORT {ports['gateway']} leaves no room for {gateways} gateways after it"
            )
        token_file = settings.home / "secrets" / "admin-token"
        env_token = env.get("TOLLFREE_TOKEN") or ""
        file_token = token_file.read_text().strip() if token_file.exists() else None
        return cls(
            home=settings.home,
            ports=ports,
            backend_store_uri=(user_uri or f"sqlite:///{settings.home / 'mlflow.db'}") if local else None,
            external_tracking_uri=None if local else user_uri,
            token_from_env=bool(env_token) and env_token != file_token,
            seed_data=env.get("TOLLFREE_SEED_DATA", "1") not in ("0", "false", "no"),
            gateways=gateways,
            state_url=state_url,
            postgres_port=int(raw_pg),
            postgres_dir=Path(env.get("TOLLFREE_POSTGRES_DIR") or settings.home / "postgres").expanduser().resolve(),
        )

    @property
    def postgres(self) -> StackPostgres | None:
        """The stack's own PostgreSQL: with several gateways and no state URL of the user's."""
        if self.gateways < 2 or self.state_url is not None:
            return None
        assert self.postgres_dir is not None
        return StackPostgres(self.postgres_dir, self.postgres_port, self.home / "secrets" / "postgres-password")

    def gateway_ports(self) -> list[int]:
        """The gateways' own ports: the gateway port itself for one; the ones after it (HAProxy on it) for more."""
        base = self.ports["gateway"]
        return [base] if self.gateways == 1 else [base + i for i in range(1, self.gateways + 1)]

    @property
    def state_dir(self) -> Path:
        return self.home / "stack"

    @property
    def record_path(self) -> Path:
        return self.state_dir / "stack.json"

    @property
    def env_file(self) -> Path:
        return self.state_dir / "env"

    @property
    def token_file(self) -> Path:
        return self.home / "secrets" / "admin-token"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    def url(self, service: str) -> str:
        return f"http://{HOST}:{self.ports[service]}"

    @property
    def prefect_api(self) -> str:
        return self.url("prefect") + "/api"

    @property
    def tracking_uri(self) -> str:
        return self.external_tracking_uri or self.url("mlflow")


def _gateways(raw: str | None) -> int:
    value = (raw or "1").strip()
    if not value.isdigit() or not 1 <= int(value) <= MAX_GATEWAYS:
        raise ValueError(f"TOLLFREE_GATEWAYS must be a whole number from 1 to {MAX_GATEWAYS}, got {value!r}")
    return int(value)


# ---- the admin token ---------------------------------------------------------------------------


def admin_token(config: StackConfig, environ: Mapping[str, str]) -> str:
    """``TOLLFREE_TOKEN`` if set; otherwise the token file's, generated once (0600, in a 0700 folder)."""
    if config.token_from_env:
        return environ["TOLLFREE_TOKEN"]
    path = config.token_file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text().strip()
        if len(token) < 16:
            raise ValueError(f"{path} holds no usable token (16+ characters); delete it to get a new one") from None
        return token
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


# ---- services ----------------------------------------------------------------------------------


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
        mlflow_env = {k: v for k, v in env.items() if k != "MLFLOW_TRACKING_URI"}
        # MLflow's server-side job runner (huey) serves GenAI jobs tollfree does not use; it also outlives SIGTERM.
        mlflow_env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        out.append(
            Service(
                "mlflow-server",
                [
                    py,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    HOST,
                    "--port",
                    str(config.ports["mlflow"]),
                    "--backend-store-uri",
                    config.backend_store_uri,
                    "--artifacts-destination",
                    str(config.home / "mlartifacts"),
                    "--workers",
                    "1",
                ],
                mlflow_env,
                config.ports["mlflow"],
                _answers(f"{config.url('mlflow')}/health"),
                config.url("mlflow"),
            )
        )
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
    out.append(
        Service(
            "stream-feed",
            [py, "-m", "infra.stream_feed"],
            {**env, "TOLLFREE_REDIS_PORT": str(redis_port)},
            None,
            lambda client: True,
        )
    )
    out.append(
        Service(
            "worker",
            [
                py,
                "-m",
                "prefect",
                "worker",
                "start",
                "--pool",
                WORK_POOL,
                "--type",
                "process",
                "--name",
                f"{WORK_POOL}-worker",
                "--install-policy",
                "never",
            ],
            dict(env),
            None,
            lambda client: worker_online(config, client),
        )
    )
    return out


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
