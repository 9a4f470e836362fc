"""Test session set-up: one throw-away state folder, real components, telemetry off.

The environment is fixed in ``pytest_configure``, before any test module imports Prefect, MLflow or
Feast (they read it once at import). Tests never touch the user's ``.tollfree/`` or registry.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

import pytest

_SESSION_HOME: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_HOME
    _SESSION_HOME = Path(tempfile.mkdtemp(prefix="tollfree-test-"))
    os.environ["TOLLFREE_HOME"] = str(_SESSION_HOME)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow.db'}"
    os.environ["PREFECT_HOME"] = str(_SESSION_HOME / "prefect")
    os.environ["TOLLFREE_TOKEN"] = "test-admin-" + secrets.token_hex(16)
    os.environ.pop("TOLLFREE_TOKENS_FILE", None)
    from serving.settings import export_defaults

    export_defaults(os.environ)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_HOME is not None and not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def session_home() -> Path:
    assert _SESSION_HOME is not None
    return _SESSION_HOME


@pytest.fixture(scope="session")
def admin_token() -> str:
    return os.environ["TOLLFREE_TOKEN"]


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's test harness: a real API server on a temporary database, once per session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def world(prefect_harness):
    """Data, features and a registered champion, built once by the real flows."""
    from tests.world import build_world

    return build_world()


@pytest.fixture
def restore_tracking_uri():
    """A flow sets MLflow's process-wide tracking URI from the environment it ran in; a test that ran one
    against another registry (a server it kills, a closed port) leaves the next tests' on the session's."""
    session_uri = os.environ["MLFLOW_TRACKING_URI"]  # read now: the test may point the variable elsewhere
    yield
    import mlflow

    mlflow.set_tracking_uri(session_uri)


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (started on first use); tests take a fresh database each."""
    from tests.services import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def state_database(request, tmp_path: Path):
    """A fresh state store at the schema's head, on each backend in turn: SQLite, then the session's PostgreSQL."""
    from serving.endpoints.store import EndpointStore

    if request.param == "sqlite":
        store = EndpointStore(tmp_path / "endpoints.db")
    else:
        server = request.getfixturevalue("postgres")
        store = EndpointStore(server.url(server.new_database()))
    yield store.database
    store.close()


@pytest.fixture(scope="session")
def stream_broker(tmp_path_factory: pytest.TempPathFactory):
    """A redis-server of the session's (no persistence) for the stream consumer's tests; each test uses streams
    of its own names."""
    from infra.redis import RedisServer
    from serving.replicas.local import free_port

    running = RedisServer(free_port(), tmp_path_factory.mktemp("redis"), persistent=False).start()
    try:
        yield running
    finally:
        running.stop()
