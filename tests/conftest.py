"""Test session set-up: one throw-away state folder, real components, telemetry off.

The environment is fixed in ``pytest_configure``, before any test module imports Prefect, MLflow or
Feast (they read it once at import). Tests never touch the user's ``.tollfree/`` or registry.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

_SESSION_HOME: Path | None = None
_PREFECT_SERVER = None  # the session's Prefect server, when this process started it (tests.prefect_server)
_WORLD_TEMPLATE = "TOLLFREE_TEST_WORLD_TEMPLATE"  # set by the xdist controller; its workers copy the world from there
_MACHINE_LOCK = "TOLLFREE_TEST_MACHINE_LOCK"  # set by the first pytest process; its xdist workers inherit it
# The files that take longest (about two minutes or more each in CI, ``--durations``): handed out first.
LONGEST = ("e2e/test_gateways_failover.py", "e2e/test_stack.py", "e2e/test_demo.py")


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_HOME
    _SESSION_HOME = Path(tempfile.mkdtemp(prefix="tollfree-test-"))
    os.environ.setdefault(_MACHINE_LOCK, str(_SESSION_HOME / "machine.lock"))
    os.environ["TOLLFREE_HOME"] = str(_SESSION_HOME)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_HOME / 'mlflow.db'}"
    os.environ["PREFECT_HOME"] = str(_SESSION_HOME / "prefect")
    os.environ["TOLLFREE_TOKEN"] = "test-admin-" + secrets.token_hex(16)
    os.environ.pop("TOLLFREE_TOKENS_FILE", None)
    from serving.replica_server.imports import skip_feast_type_checks
    from serving.settings import export_defaults

    export_defaults(os.environ)
    # No typeguard checks on Feast's classes in a test process: the definitions tests use are the repository's own,
    # and the world's build (a process of its own, as every flow the tests start) runs them checked. The
    # instrumentation would cost each worker about 4 CPU-seconds of its collection.
    skip_feast_type_checks()
    if not hasattr(config, "workerinput"):  # not an xdist worker: those inherit the controller's server
        os.environ.pop("PREFECT_API_URL", None)  # never a server of the user's shell
        if getattr(config.option, "numprocesses", None):
            _start_prefect_server()  # the xdist controller, before its workers exist
            # the test world's template (tests.world): named here, built by the first worker that needs it
            os.environ[_WORLD_TEMPLATE] = tempfile.mkdtemp(prefix="tollfree-test-")  # as long as a worker's folder


def _start_prefect_server() -> str:
    global _PREFECT_SERVER
    from tests.prefect_server import PrefectServer

    assert _SESSION_HOME is not None
    _PREFECT_SERVER = PrefectServer(_SESSION_HOME / "prefect-server").start()
    os.environ["PREFECT_API_URL"] = _PREFECT_SERVER.api_url
    return _PREFECT_SERVER.api_url


def pytest_unconfigure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and os.environ.get(_WORLD_TEMPLATE):
        template = Path(os.environ[_WORLD_TEMPLATE])
        if not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
            shutil.rmtree(template, ignore_errors=True)
            template.with_name(f"{template.name}.log").unlink(missing_ok=True)
    if _PREFECT_SERVER is not None:
        _PREFECT_SERVER.stop()
    if _SESSION_HOME is not None and not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
        shutil.rmtree(_SESSION_HOME, ignore_errors=True)


@contextmanager
def _machine(exclusive: bool) -> Iterator[None]:
    """The machine, shared with the other xdist workers' tests or held alone. A test marked ``alone`` waits
    until no other test runs, and none starts until it ends (its setup and teardown included): its assertions
    read the clock (a window, a deadline, a latency) and a neighbour's load would move them. An ``alone``
    test that is waiting goes before any shared test that arrives after it (the gate file), so it is not
    starved. In one process (no xdist) the two never overlap: no lock is ever waited on."""
    path = Path(os.environ[_MACHINE_LOCK])
    with open(path.with_suffix(".gate"), "a+") as gate, open(path, "a+") as machine:
        fcntl.flock(gate, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        fcntl.flock(machine, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        if not exclusive:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield  # closing the files releases what is still held


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order ``make test`` hands whole files to its workers in (it turns xdist's own reordering off):
    real processes first and pure code last, so the run ends on short files and no worker is left with a long
    one while the others have nothing; the longest files (``LONGEST``) go before all others, so that none of them
    starts late and sets the run's end. An ``alone`` test first waits for the other workers' running tests to end,
    and met at points across the run those waits add up to minutes. So a file with ``alone`` and shared tests
    goes just before the unit files (its shared tests run beside them, its ``alone`` ones wait for a short one),
    and a file of ``alone`` tests only goes last: were both kinds last, the run would end on one test at a time."""
    alone = {item.path for item in items if item.get_closest_marker("alone") is not None}
    only_alone = alone - {item.path for item in items if item.get_closest_marker("alone") is None}
    order = {"e2e": 0, "integration": 1, "unit": 3}
    root = Path(__file__).resolve().parent

    def rank(item: pytest.Item) -> int:
        if item.path in only_alone:
            return 4
        if item.path.relative_to(root).as_posix() in LONGEST:
            return -1
        return 2 if item.path in alone else order.get(item.path.parent.name, 3)

    items.sort(key=rank)  # stable: tests keep their order within a file, files theirs within a rank


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    with _machine(exclusive=item.get_closest_marker("alone") is not None):
        yield


@pytest.fixture(scope="session")
def session_home() -> Path:
    assert _SESSION_HOME is not None
    return _SESSION_HOME


@pytest.fixture(scope="session")
def admin_token() -> str:
    return os.environ["TOLLFREE_TOKEN"]


@pytest.fixture(scope="session")
def prefect_harness():
    """The session's Prefect server (``tests.prefect_server``), ready: the xdist controller started it for all
    its workers, or this process starts it now."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from tests.prefect_server import wait_ready

    api_url = os.environ.get("PREFECT_API_URL") or _start_prefect_server()
    wait_ready(api_url)
    with temporary_settings(updates={PREFECT_API_URL: api_url}):  # in case Prefect read the environment before
        yield
        _drain_prefect_clients()


def _drain_prefect_clients() -> None:
    """Send what this process's Prefect log and event workers still hold while the server is up (the harness
    does the same before it stops its server); without it, a run without xdist stops the server first and the
    workers' flush at exit fails."""
    import inspect

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.utilities.asyncutils import run_coro_as_sync

    async def drain() -> None:
        try:
            pending = APILogWorker.instance().drain()
            if inspect.isawaitable(pending):
                await pending
        except RuntimeError:  # never started
            pass
        pending = EventsWorker.drain_all()
        if inspect.isawaitable(pending):
            await pending

    run_coro_as_sync(drain())


@pytest.fixture(scope="session")
def world(prefect_harness):
    """Data, features and a registered champion, built once by the real flows: for all xdist workers by the
    controller (copied here from its template), or here."""
    from tests.world import build_template, build_world, copy_world

    template = os.environ.get(_WORLD_TEMPLATE)
    if template and _SESSION_HOME is not None:
        build_template(Path(template), dict(os.environ))
        return copy_world(Path(template), _SESSION_HOME)
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
