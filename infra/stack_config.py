"""The local stack's settings, from the environment: ports, URLs, the MLflow server's backend, the number of
gateways and their state store, and the admin token. ``infra.services`` turns them into the processes to start.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infra.postgres import StackPostgres
from serving.settings import export_defaults

HOST = "127.0.0.1"
PORT_DEFAULTS = {
    "prefect": ("TOLLFREE_PREFECT_PORT", 4200),
    "mlflow": ("TOLLFREE_MLFLOW_PORT", 5000),
    "gateway": ("TOLLFREE_GATEWAY_PORT", 8080),
    "redis": ("TOLLFREE_REDIS_PORT", 6380),
    "prometheus": ("TOLLFREE_PROMETHEUS_PORT", 9090),
}
DATABASE_SCHEMES = {"sqlite", "postgresql", "mysql", "mssql"}
MAX_GATEWAYS = 16


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
