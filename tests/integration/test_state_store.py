"""The state store's schema and availability: Alembic migrations (from a database made before them, under
concurrent gateways, refused when asked), a PostgreSQL that is unreachable at start or goes away while
serving, and the replica table. Real SQLite files and a real PostgreSQL server; no message may carry the
password."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import text

from serving.endpoints.store import EndpointStore
from serving.protocol.errors import ApiError
from serving.replicas.local import free_port, replica_token
from serving.state import migrate
from serving.state.changes import ChangeListener
from serving.state.database import StateStoreError, open_database
from serving.state.replica_table import ReplicaRow, ReplicaTable
from serving.traffic.replica import process_id
from tests.integration.test_endpoint_store import make_record

ROOT = Path(__file__).resolve().parents[2]

# what the store's hand-written DDL created before Alembic kept the schema
PRE_ALEMBIC = (
    "CREATE TABLE IF NOT EXISTS endpoints (name TEXT PRIMARY KEY, config_version INTEGER NOT NULL, "
    "revision INTEGER NOT NULL, record TEXT NOT NULL)"
)


def test_a_database_from_before_migrations_is_stamped_upgraded_and_keeps_its_records(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.db"
    record = make_record("fraud")
    with sqlite3.connect(path) as db:
        db.execute(PRE_ALEMBIC)
        db.execute("INSERT INTO endpoints VALUES (?, 1, 4, ?)", ("fraud", record.to_json()))
    assert migrate.current(open_database(path)) == "pre-alembic"

    store = EndpointStore(path)
    assert migrate.current(store.database) == migrate.head()
    got = store.get("fraud")
    assert got.revision == 4 and got.config == record.config


def test_manual_migration_refuses_an_old_schema_naming_the_command(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.db"
    with sqlite3.connect(path) as db:
        db.execute(PRE_ALEMBIC)
    with pytest.raises(StateStoreError) as refused:
        EndpointStore(path, migrate=False)
    assert "python -m serving.state upgrade" in str(refused.value) and "pre-alembic" in str(refused.value)
    with sqlite3.connect(path) as db:  # nothing was changed
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'alembic_version'").fetchone() is None

    env = {**os.environ, "TOLLFREE_STATE_URL": f"sqlite:///{path}"}
    done = subprocess.run(
        [sys.executable, "-m", "serving.state", "upgrade"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"pre-alembic -> {migrate.head()}" in done.stdout
    EndpointStore(path, migrate=False).create(make_record())


def test_a_schema_newer_than_this_code_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.db"
    EndpointStore(path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StateStoreError, match=r"revision 9999.*run a newer tollfree"):
        EndpointStore(path)


def test_gateways_starting_together_on_one_postgresql_migrate_it_once(postgres) -> None:
    url = postgres.url(postgres.new_database())
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        try:
            EndpointStore(url).close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    store = EndpointStore(url)
    with store.database.engine.connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [migrate.head()]
    store.close()


def test_an_unreachable_postgresql_at_start_is_refused_naming_the_url_without_its_password() -> None:
    url = f"postgresql://tollfree:hunter2secret@127.0.0.1:{free_port()}/tollfree"
    with pytest.raises(StateStoreError) as refused:
        EndpointStore(url, timeout_s=2)
    message = str(refused.value)
    assert "hunter2secret" not in message
    assert "postgresql+psycopg://tollfree:***@127.0.0.1" in message and "did not answer" in message


def test_the_gateway_refuses_to_start_on_an_unreachable_state_store(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TOLLFREE_HOME": str(tmp_path),
        "TOLLFREE_TOKEN": "t" * 32,
        "TOLLFREE_STATE_URL": f"postgresql://tollfree:hunter2secret@127.0.0.1:{free_port()}/tollfree",
    }
    done = subprocess.run(
        [sys.executable, "-m", "serving", "--port", str(free_port())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "tollfree:***@127.0.0.1" in done.stderr and "did not answer" in done.stderr
    assert "hunter2secret" not in done.stderr + done.stdout


def test_a_postgresql_outage_is_a_503_naming_the_store_and_the_store_recovers(postgres, caplog) -> None:
    store = EndpointStore(postgres.url(postgres.new_database()))
    store.create(make_record("fraud"))
    postgres.stop()
    try:
        for attempt in (lambda: store.get("fraud"), lambda: store.create(make_record("churn")), store.list):
            with pytest.raises(ApiError) as failed:
                attempt()
            assert (failed.value.status_code, failed.value.error_code) == (503, "TEMPORARILY_UNAVAILABLE")
            assert "tollfree:***@127.0.0.1" in failed.value.message
    finally:
        postgres.start()
    assert postgres.password not in failed.value.message + caplog.text
    assert [r.name for r in store.list()] == ["fraud"]  # nothing half-written; pooled connections replaced
    store.create(make_record("churn"))
    assert [r.name for r in store.list()] == ["churn", "fraud"]
    store.close()


def _row(port: int, owner: int, entity: str = "m-1", pid: int = 1) -> ReplicaRow:
    return ReplicaRow(
        replica_id=f"local:127.0.0.1:{port}:{pid}",
        host="127.0.0.1",
        port=port,
        pid=pid,
        endpoint="ep",
        entity=entity,
        model_uri="models:/m/1",
        backend="local",
        started_at=1.0,
        owner_pid=owner,
    )


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_replica_table_replaces_only_its_own_gateway_rows(backend, tmp_path, request) -> None:
    if backend == "sqlite":
        store = EndpointStore(tmp_path / "endpoints.db")
    else:
        server = request.getfixturevalue("postgres")
        store = EndpointStore(server.url(server.new_database()))
    table = ReplicaTable(store.database)
    table.replace("ep", "m-1", "models:/m/1", 100, [_row(1, 100), _row(2, 100)])
    table.replace("ep", "m-1", "models:/m/1", 200, [_row(3, 200)])  # another live gateway's replica
    table.replace("ep", "m-1", "models:/m/1", 100, [_row(2, 100)])  # gateway 100 scaled down to one
    assert sorted((r.port, r.owner_pid) for r in table.all()) == [(2, 100), (3, 200)]
    table.replace("ep", "m-1", "models:/m/1", 300, [_row(2, 300)])  # gateway 300 adopted port 2 from 100
    assert sorted((r.port, r.owner_pid) for r in table.all()) == [(2, 300), (3, 200)]
    table.forget([_row(3, 200)])
    assert [(r.port, r.owner_pid) for r in table.all()] == [(2, 300)]
    assert [r.replica_id for r in table.all()] == ["local:127.0.0.1:2:1"]
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_replica_rows_from_before_the_replica_id_get_their_process_id(backend, tmp_path, request) -> None:
    if backend == "sqlite":
        database = open_database(f"sqlite:///{tmp_path / 'endpoints.db'}")
    else:
        server = request.getfixturevalue("postgres")
        database = open_database(server.url(server.new_database()))
    with database.engine.begin() as connection:
        command.upgrade(migrate._config(connection), "0004")
        connection.execute(
            text(
                "INSERT INTO replicas (host, port, pid, endpoint, entity, model_uri, backend, owner_pid, started_at) "
                "VALUES ('127.0.0.1', 8001, 41, 'ep', 'm-1', 'models:/m/1', 'local', 7, 1.0)"
            )
        )
    migrate.upgrade(database)
    assert [r.replica_id for r in ReplicaTable(database).all()] == ["local:127.0.0.1:8001:41"]
    assert process_id("127.0.0.1", 8001, 41) == "local:127.0.0.1:8001:41"  # the id the gateway gives the process
    database.engine.dispose()


def test_the_replica_token_is_kept_in_the_state_folder_readable_only_by_its_owner(tmp_path: Path) -> None:
    token_file = tmp_path / "replica.token"
    first = replica_token({}, token_file)
    assert replica_token({}, token_file) == first and len(first) >= 32
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert replica_token({"TOLLFREE_REPLICA_TOKEN": "from-a-secret"}, token_file) == "from-a-secret"


def test_a_write_through_one_gateway_is_heard_by_the_others_at_once(postgres) -> None:
    url = postgres.url(postgres.new_database())
    writer, listening = EndpointStore(url), EndpointStore(url)
    heard = threading.Event()
    listener = ChangeListener(listening.database.url, heard.set)
    listener.start()
    try:
        deadline = time.monotonic() + 10  # the listener is connected once a write is heard
        for n in range(1000):
            writer.create(make_record(f"warm-{n}"))
            if heard.wait(0.2):
                break
            assert time.monotonic() < deadline, "no notice heard"
        writes = {
            "create": lambda: writer.create(make_record("fraud")),
            "put": lambda: writer.put(writer.get("fraud")),
            "compare_and_set": lambda: writer.compare_and_set("fraud", 1, writer.get("fraud")),
            "delete": lambda: writer.delete("fraud"),
            "replica table": lambda: ReplicaTable(writer.database).replace("ep", "m-1", "models:/m/1", 1, [_row(9, 1)]),
        }
        for what, write in writes.items():
            time.sleep(0.05)
            heard.clear()
            write()
            assert heard.wait(1.0), f"{what} was not heard within 1 s"
    finally:
        listener.stop()
        writer.close()
        listening.close()


@pytest.mark.parametrize(
    "url, says",
    [
        ("not a url at all", "is not a database URL"),
        ("mysql://u:hunter2secret@127.0.0.1/x", "SQLite or PostgreSQL"),
        ("postgresql://u:hunter2secret@127.0.0.1:{port}/x", "did not answer"),
    ],
)
def test_the_state_cli_refuses_a_bad_or_unreachable_store_clearly(url, says, tmp_path: Path) -> None:
    env = {**os.environ, "TOLLFREE_HOME": str(tmp_path), "TOLLFREE_STATE_URL": url.format(port=free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "serving.state", "current"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and says in done.stderr, done.stderr
    assert "hunter2secret" not in done.stderr + done.stdout
