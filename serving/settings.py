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

    @property
    def scrape_targets_dir(self) -> Path:
        """Where each running gateway lists what Prometheus scrapes (``serving.gateway.scrape_targets``)."""
        return self.home / "prometheus" / "targets"

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


@dataclass(frozen=True)
class EnvVar:
    """One environment variable tollfree reads: its name, its default (as text; "-" when unset means off or
    required) and what it means. ``ENVIRONMENT`` lists every one; the docs' reference page is generated from it."""

    name: str
    default: str
    meaning: str
    area: str


# Every TOLLFREE_* variable read anywhere in serving/, flows/, monitoring/, infra/ and feature_repo/
# (tests/unit/test_environment_table.py holds the code to this table, both ways).
ENVIRONMENT: tuple[EnvVar, ...] = (
    # every process
    EnvVar(
        "TOLLFREE_HOME",
        "`.tollfree/` beside the project",
        "the state folder: registry, features, endpoints, logs",
        "all",
    ),
    EnvVar(
        "TOLLFREE_TOKEN",
        "- (required by the gateway)",
        "the admin bearer token, 16 characters or more; never logged",
        "all",
    ),
    EnvVar(
        "TOLLFREE_GATEWAY_URL",
        "the newest live gateway's record, else `http://127.0.0.1:8080`",
        "the gateway the flows and `mlflow deployments -t tollfree` talk to",
        "all",
    ),
    EnvVar(
        "TOLLFREE_REPLICATE_TO",
        "none: no replication",
        "the other regions' registry URIs, comma-separated: the replicate flow copies each promoted version there",
        "all",
    ),
    EnvVar(
        "TOLLFREE_EDGE_BUNDLES",
        "off",
        "`1`: the edge-bundle flow bundles each model's champion for edge devices after every promotion",
        "all",
    ),
    EnvVar(
        "TOLLFREE_ENDPOINTS_FILE",
        "none: no apply schedule",
        "an endpoints file the deployments apply every 5 minutes (`flows.apply`)",
        "all",
    ),
    # the gateway
    EnvVar(
        "TOLLFREE_TOKENS_FILE",
        "-",
        "a JSON file of scoped tokens, each with its endpoints and an optional rate limit",
        "gateway",
    ),
    EnvVar(
        "TOLLFREE_STATE_URL",
        "`sqlite:///$TOLLFREE_HOME/endpoints.db`",
        "the serving tier's state store (SQLite or `postgresql://...`)",
        "gateway",
    ),
    EnvVar(
        "TOLLFREE_STATE_MIGRATE",
        "`auto`",
        "`manual`: refuse an old schema and name `python -m serving.state upgrade`",
        "gateway",
    ),
    EnvVar(
        "TOLLFREE_GRPC_PORT",
        "none: no gRPC",
        "the port of the Open Inference Protocol's gRPC service (`--grpc-port` wins; `0`: a free port)",
        "gateway",
    ),
    EnvVar("TOLLFREE_AUTOSCALE", "`on`", "`off`: no autoscaler in `python -m serving`", "gateway"),
    EnvVar("TOLLFREE_WARM_POOL", "`1`", "standby replica processes kept with the runtime imported", "gateway"),
    EnvVar(
        "TOLLFREE_REQUEST_TIMEOUT_S", "`30`", "seconds a replica has to answer (`--request-timeout` wins)", "gateway"
    ),
    EnvVar("TOLLFREE_BACKEND", "`local`", "where replicas run: `local` processes or `kubernetes` pods", "gateway"),
    EnvVar(
        "TOLLFREE_K8S_NAMESPACE", "the gateway pod's namespace", "namespace of the replicas' Deployments", "kubernetes"
    ),
    EnvVar(
        "TOLLFREE_K8S_TEMPLATE",
        "`infra/k8s/replica/template.yaml`",
        "the replica template the Deployments are rendered from",
        "kubernetes",
    ),
    EnvVar("TOLLFREE_K8S_IMAGE", "the template's image", "replaces the replica container's image", "kubernetes"),
    # replicas
    EnvVar(
        "TOLLFREE_REPLICA_TOKEN",
        "the state folder's `replica.token` (required on Kubernetes)",
        "the token replicas accept invocations with; gateways that share replicas share it",
        "replica",
    ),
    EnvVar(
        "TOLLFREE_REPLICA_HOST",
        "`127.0.0.1`",
        "the address a gateway's local replicas listen on, where the other gateways route to them",
        "gateway",
    ),
    EnvVar(
        "TOLLFREE_REPLICA_ORPHAN_S",
        "`60`",
        "seconds a replica whose gateway died waits to be adopted before it stops",
        "replica",
    ),
    EnvVar(
        "TOLLFREE_REPLICA_OWNER_PID",
        "set by the gateway",
        "the pid of the gateway that started a local replica (not for users)",
        "replica",
    ),
    # features
    EnvVar("TOLLFREE_ONLINE_STORE", "`sqlite`", "Feast's online store: `sqlite` or `redis`", "features"),
    EnvVar("TOLLFREE_REDIS", "-", "Redis's connection string for the online store (`host:port`)", "features"),
    # make up
    EnvVar("TOLLFREE_PREFECT_PORT", "`4200`", "the Prefect server's port", "stack"),
    EnvVar("TOLLFREE_MLFLOW_PORT", "`5000`", "the MLflow server's port", "stack"),
    EnvVar(
        "TOLLFREE_GATEWAY_PORT",
        "`8080`",
        "the gateway's port (HAProxy's with several gateways; they take the ports after it)",
        "stack",
    ),
    EnvVar("TOLLFREE_GATEWAYS", "`1`", "gateways `make up` starts (2 to 16: on PostgreSQL, behind HAProxy)", "stack"),
    EnvVar("TOLLFREE_POSTGRES_PORT", "`5433`", "the stack's PostgreSQL port (several gateways)", "stack"),
    EnvVar("TOLLFREE_POSTGRES_DIR", "`$TOLLFREE_HOME/postgres`", "the stack's PostgreSQL cluster folder", "stack"),
    EnvVar("TOLLFREE_REDIS_PORT", "`6380`", "the stack's redis-server port (stream inputs' broker)", "stack"),
    EnvVar("TOLLFREE_PROMETHEUS_PORT", "`9090`", "the stack's Prometheus port (UI, API, alerts)", "stack"),
    EnvVar("TOLLFREE_STREAM_RATE", "`5`", "events a second the stack's stream feed appends", "stack"),
    EnvVar(
        "TOLLFREE_STREAM_ENDPOINT", "`fraud`", "the endpoint the feed attaches its stream to (empty: none)", "stack"
    ),
    EnvVar("TOLLFREE_SEED_DATA", "`1`", "`0`: `make up` writes no demo data into an empty state folder", "stack"),
    EnvVar("TOLLFREE_STACK_TIMEOUT_S", "`180`", "seconds `make up` waits for each service to answer", "stack"),
    EnvVar(
        "TOLLFREE_STACK_ID",
        "set by `make up`",
        "marks every process the stack started, so `make down` finds it (not for users)",
        "stack",
    ),
)
