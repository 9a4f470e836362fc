"""Settings read from an injected environment mapping (tests pass a dict).

Everything tollfree keeps lives in one state folder, ``TOLLFREE_HOME`` (default ``.tollfree/`` beside
the project). The MLflow registry defaults to SQLite inside it; a set ``MLFLOW_TRACKING_URI`` wins.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
DEFAULT_HOME = PROJECT_DIR / ".tollfree"

# Every library of the stack phones home by default; there is no network here and no reason to.
TELEMETRY_OFF = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "FEAST_USAGE": "False",
    "GIT_PYTHON_REFRESH": "quiet",
}
# A flow run in a fresh process starts a temporary Prefect server; on a busy 2-core machine that can take
# longer than Prefect's default wait, and the run then fails before it starts.
PREFECT_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}


@dataclass(frozen=True)
class Settings:
    home: Path
    tracking_uri: str
    admin_token: str | None
    state_url_override: str | None = None

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    @property
    def artifacts_dir(self) -> Path:
        return self.home / "mlartifacts"

    @property
    def prefect_home(self) -> Path:
        return self.home / "prefect"

    @property
    def inference_log_dir(self) -> Path:
        return self.home / "inference_log"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def state_url(self) -> str:
        """The serving tier's state store: ``TOLLFREE_STATE_URL``, else SQLite ``endpoints.db`` in the state folder."""
        return self.state_url_override or f"sqlite:///{self.home / 'endpoints.db'}"

    @property
    def batch_dir(self) -> Path:
        return self.home / "batch"

    @property
    def gateways_dir(self) -> Path:
        """Where each running gateway records its URL for clients on this state folder (``serving.discovery``)."""
        return self.home / "gateways"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Settings:
        home = Path(environ.get("TOLLFREE_HOME") or DEFAULT_HOME).expanduser().resolve()
        tracking = environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{home / 'mlflow.db'}"
        return cls(
            home=home,
            tracking_uri=tracking,
            admin_token=environ.get("TOLLFREE_TOKEN") or None,
            state_url_override=environ.get("TOLLFREE_STATE_URL") or None,
        )


def export_defaults(environ: MutableMapping[str, str]) -> Settings:
    """Fill in what child processes and libraries read from the environment; never override a value.

    Called once by each entry point (CLI, flow runner, test session) before the stack is imported:
    telemetry off, the state folder absolute, Prefect's home inside it (created), MLflow's URI explicit.
    """
    for key, value in {**TELEMETRY_OFF, **PREFECT_DEFAULTS}.items():
        environ.setdefault(key, value)
    settings = Settings.from_environ(environ)
    environ["TOLLFREE_HOME"] = str(settings.home)
    environ.setdefault("MLFLOW_TRACKING_URI", settings.tracking_uri)
    environ.setdefault("PREFECT_HOME", str(settings.prefect_home))
    # Prefect creates its home without parents and fails later, obscurely, if it cannot.
    Path(environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    return settings
