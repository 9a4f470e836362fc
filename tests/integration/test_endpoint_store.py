from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from serving.endpoints.spec import EndpointCoreConfig, EndpointRecord
from serving.endpoints.store import EndpointStore
from serving.endpoints.validation import normalize_config
from serving.protocol.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]


def make_record(name: str = "fraud", version: str = "3", creator: str = "alice") -> EndpointRecord:
    entity = {"entity_name": "fraud_model", "entity_version": version}
    config = normalize_config(EndpointCoreConfig.model_validate({"served_entities": [entity]}))
    return EndpointRecord(
        name=name,
        id=f"id-{name}",
        creator=creator,
        created_ms=1000,
        updated_ms=1000,
        config=config,
        config_version=1,
        ready="NOT_READY",
        config_update="IN_PROGRESS",
        pending_config=None,
        ai_gateway=None,
        state_message=None,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path: Path) -> EndpointStore:
    """The same contract on the embedded default and on a real PostgreSQL (a fresh database per test)."""
    if request.param == "sqlite":
        return EndpointStore(tmp_path / "state" / "endpoints.db")
    server = request.getfixturevalue("postgres")
    store = EndpointStore(server.url(server.new_database()))
    request.addfinalizer(store.close)
    return store


def api_error(fn, *args) -> ApiError:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as info:
        fn(*args)
    return info.value


def test_create_then_get_returns_the_same_record(store: EndpointStore) -> None:
    created = store.create(make_record())
    assert created.revision == 1
    got = store.get("fraud")
    assert got == created
    assert got.config.served_entities[0].resolved_version == "3"


def test_the_embedded_store_uses_a_wal_journal(tmp_path: Path) -> None:
    EndpointStore(tmp_path / "endpoints.db").create(make_record())
    with sqlite3.connect(tmp_path / "endpoints.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_duplicate_create_is_409_and_keeps_the_first(store: EndpointStore) -> None:
    store.create(make_record(creator="alice"))
    err = api_error(store.create, make_record(creator="mallory"))
    assert (err.status_code, err.error_code) == (409, "RESOURCE_ALREADY_EXISTS")
    assert '"fraud"' in err.message
    assert store.get("fraud").creator == "alice"


@pytest.mark.parametrize("op", ["get", "delete"])
def test_missing_endpoint_is_404_naming_it(store: EndpointStore, op: str) -> None:
    err = api_error(getattr(store, op), "ghost")
    assert (err.status_code, err.error_code) == (404, "RESOURCE_DOES_NOT_EXIST")
    assert '"ghost"' in err.message


def test_404_message_cuts_long_names(store: EndpointStore) -> None:
    err = api_error(store.get, "g" * 63 + "SECRET")
    assert "SECRET" not in err.message


def test_put_of_missing_endpoint_is_404(store: EndpointStore) -> None:
    err = api_error(store.put, make_record("ghost"))
    assert err.status_code == 404
    assert store.list() == []


def test_list_is_sorted_by_name(store: EndpointStore) -> None:
    for name in ["zeta", "Alpha", "beta", "alpha-2"]:
        store.create(make_record(name))
    assert [r.name for r in store.list()] == sorted(["zeta", "Alpha", "beta", "alpha-2"])


def test_put_updates_and_bumps_revision(store: EndpointStore) -> None:
    record = store.create(make_record())
    record.ready, record.config_update, record.state_message = "READY", "NOT_UPDATING", None
    store.put(record)
    assert record.revision == 2
    got = store.get("fraud")
    assert (got.ready, got.config_update, got.revision) == ("READY", "NOT_UPDATING", 2)


def test_delete_removes_and_second_delete_is_404(store: EndpointStore) -> None:
    store.create(make_record())
    store.delete("fraud")
    assert api_error(store.get, "fraud").status_code == 404
    assert api_error(store.delete, "fraud").status_code == 404
    store.create(make_record())  # the name is free again


def test_compare_and_set_succeeds_on_the_expected_version(store: EndpointStore) -> None:
    current = store.create(make_record())
    new_config = make_record(version="4").config
    done = store.compare_and_set("fraud", 1, dataclasses.replace(current, config=new_config, config_version=2))
    got = store.get("fraud")
    assert got.config_version == 2 and got.config.served_entities[0].entity_version == "4"
    assert done.revision == got.revision == 2


def test_compare_and_set_rejects_a_stale_config_version(store: EndpointStore) -> None:
    current = store.create(make_record())
    store.compare_and_set("fraud", 1, dataclasses.replace(current, config_version=2))
    stale = dataclasses.replace(current, config=make_record(version="9").config, config_version=2, revision=0)
    err = api_error(store.compare_and_set, "fraud", 1, stale)
    assert (err.status_code, err.error_code) == (409, "RESOURCE_CONFLICT")
    assert store.get("fraud").config.served_entities[0].entity_version == "3"


def test_compare_and_set_rejects_a_write_that_kept_the_version(store: EndpointStore) -> None:
    """Two updates read the same record; the second must not overwrite the first's pending config."""
    read_a = store.create(make_record())
    read_b = store.get("fraud")
    pending_a = make_record(version="4").config
    store.compare_and_set("fraud", 1, dataclasses.replace(read_a, pending_config=pending_a))
    pending_b = make_record(version="5").config
    err = api_error(store.compare_and_set, "fraud", 1, dataclasses.replace(read_b, pending_config=pending_b))
    assert err.status_code == 409
    stored = store.get("fraud").pending_config
    assert stored is not None and stored.served_entities[0].entity_version == "4"


def test_compare_and_set_on_missing_endpoint_is_404(store: EndpointStore) -> None:
    assert api_error(store.compare_and_set, "ghost", 1, make_record("ghost")).status_code == 404


def test_compare_and_set_refuses_a_record_of_another_endpoint(store: EndpointStore) -> None:
    store.create(make_record())
    with pytest.raises(ValueError):
        store.compare_and_set("fraud", 1, make_record("other"))


def test_concurrent_creates_of_one_name_have_exactly_one_winner(store: EndpointStore) -> None:
    threads_n = 8
    barrier = threading.Barrier(threads_n)
    wins: list[str] = []
    conflicts: list[int] = []
    others: list[BaseException] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.create(make_record(creator=f"user{i}"))
            wins.append(f"user{i}")
        except ApiError as exc:
            conflicts.append(exc.status_code)
        except BaseException as exc:
            others.append(exc)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert others == []
    assert len(wins) == 1 and conflicts == [409] * (threads_n - 1)
    assert store.get("fraud").creator == wins[0]


def test_concurrent_compare_and_set_has_exactly_one_winner(store: EndpointStore) -> None:
    store.create(make_record())
    threads_n = 6
    reads = [store.get("fraud") for _ in range(threads_n)]
    barrier = threading.Barrier(threads_n)
    results: list[int] = []

    def attempt(i: int) -> None:
        barrier.wait()
        try:
            store.compare_and_set("fraud", 1, dataclasses.replace(reads[i], state_message=f"w{i}", config_version=2))
            results.append(200)
        except ApiError as exc:
            results.append(exc.status_code)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [200] + [409] * (threads_n - 1)
    assert store.get("fraud").revision == 2


def test_records_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.db"
    first = EndpointStore(path)
    first.create(make_record("fraud"))
    first.create(make_record("churn"))
    first.delete("churn")
    again = EndpointStore(path)
    assert [r.name for r in again.list()] == ["fraud"]
    assert again.get("fraud") == first.get("fraud")


def test_a_failed_write_leaves_nothing_behind(store: EndpointStore) -> None:
    record = store.create(make_record())
    # A conflict found inside the transaction rolls it back.
    changed = dataclasses.replace(record, ready="READY", config_update="NOT_UPDATING")
    assert api_error(store.compare_and_set, "fraud", 5, changed).status_code == 409
    assert store.get("fraud") == record
    # A process that dies in the middle of a write leaves the previous state.
    script = (
        "import os, sys\n"
        "from sqlalchemy import text\n"
        "from serving.endpoints.store import EndpointStore\n"
        "store = EndpointStore(sys.argv[1])\n"
        "with store.database.engine.begin() as db:\n"
        "    db.execute(text('DELETE FROM endpoints'))\n"
        "    db.execute(text(\"INSERT INTO endpoints VALUES ('half', 1, 1, '{')\"))\n"
        "    os._exit(3)\n"
    )
    url = store.database.url.render_as_string(hide_password=False)
    done = subprocess.run([sys.executable, "-c", script, url], cwd=ROOT, timeout=60)
    assert done.returncode == 3
    assert [r.name for r in store.list()] == ["fraud"]
    assert store.get("fraud") == record
