"""A config change sent while a new leader takes an endpoint over (while it reads the state, or while the takeover
brings the endpoint's replicas up) waits for the takeover, then replaces and stops the set the takeover brought
up: an endpoint's rollouts run one at a time, each from what the one before left live, and the record says the
change is done only once its entity serves. The endpoint manager on its own event loop over a real SQLite state
store, stepped as ``Leadership`` steps a leader; replicas are fakes whose start the test holds and releases.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field

from serving.endpoints import spec, validation
from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from tests.fakes import FakeReplicas

NAME = "ep"


@dataclass(eq=False)
class HeldReplica:
    """A replica 'process' of the fake backend: ready once its model's gate opens, stopped when told."""

    model_uri: str
    pid: int
    host: str = "127.0.0.1"
    outstanding: int = 0
    started_at: float = field(default_factory=time.time)
    running: bool = True

    @property
    def port(self) -> int:
        return self.pid

    @property
    def id(self) -> str:
        return f"local:{self.host}:{self.port}:{self.pid}"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.running


class HeldBackend:
    """The part of ``LocalBackend`` a rollout uses; a replica of model URI ``u`` answers ready once ``gate(u)`` is
    set."""

    def __init__(self) -> None:
        self.spawned: list[HeldReplica] = []
        self._gates: dict[str, threading.Event] = {}
        self._pids = itertools.count(1000)

    def gate(self, model_uri: str) -> threading.Event:
        return self._gates.setdefault(model_uri, threading.Event())

    def prepare(self) -> None: ...

    def spawn(self, model_uri: str) -> HeldReplica:
        replica = HeldReplica(model_uri, next(self._pids))
        self.spawned.append(replica)
        return replica

    def wait_ready(self, replica: HeldReplica, timeout_s: float) -> dict:
        assert self.gate(replica.model_uri).wait(timeout_s), f"{replica.model_uri} never released"
        return {}

    async def stop(self, replica: HeldReplica) -> None:
        replica.running = False

    async def close(self) -> None: ...


def _config(entity: str, version: str) -> spec.EndpointCoreConfig:
    raw = spec.EndpointCoreConfig.model_validate(
        {"served_entities": [{"name": entity, "entity_name": "m", "entity_version": version}]}
    )
    return validation.normalize_config(raw, NAME)


async def _until(condition, what: str, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def _stored(tmp_path) -> EndpointStore:  # type: ignore[no-untyped-def]
    """The state a dead leader left: endpoint ``ep`` serving entity ``before`` (model m, version 1)."""
    store = EndpointStore(tmp_path / "endpoints.db")
    store.create(
        spec.EndpointRecord(
            name=NAME,
            id="id",
            creator="test",
            created_ms=0,
            updated_ms=0,
            config=_config("before", "1"),
            ready="READY",
            config_update="NOT_UPDATING",
        )
    )
    return store


def _follower(store: EndpointStore, backend: HeldBackend, tmp_path) -> EndpointManager:  # type: ignore[no-untyped-def]
    """A follower's endpoint manager over ``store``, its replicas started by ``backend``."""
    manager = EndpointManager(
        store,
        lambda model, version, alias: version or "1",
        {},
        tmp_path / "logs",
        home=tmp_path,
        replica_client=FakeReplicas(),
    )
    manager.backend = manager.placement.backend = backend  # type: ignore[assignment]
    manager.leading = False
    return manager


async def _lead_on(manager: EndpointManager) -> None:
    """What ``Leadership.step`` does for a leader, every 20 ms: apply what the store says."""
    while True:
        await manager.reconciler.reconcile()
        await asyncio.sleep(0.02)


def _check(backend: HeldBackend, running: list[bool], after: list[str], record: spec.EndpointRecord) -> None:
    """The takeover's set came up, then the change replaced it: one replica each, the first stopped (``running``:
    each replica's, once the change ended)."""
    assert [r.model_uri for r in backend.spawned] == ["models:/m/1", "models:/m/2"], backend.spawned
    assert running == [False, True], "the set the takeover brought up was never stopped"
    assert after == ["after"] and record.config_update == "NOT_UPDATING" and record.config_version == 2
    assert [e.name for e in record.config.served_entities] == ["after"]


def test_a_change_sent_while_the_new_leader_reads_the_state_waits_for_the_takeover(tmp_path):
    store, backend = _stored(tmp_path), HeldBackend()

    async def scenario() -> tuple[list[bool], list[str], spec.EndpointRecord]:
        manager = _follower(store, backend, tmp_path)
        reading, go = asyncio.Event(), asyncio.Event()
        left_running = manager.book.left_running

        async def held(records):  # type: ignore[no-untyped-def]
            reading.set()
            await go.wait()
            return await left_running(records)

        manager.book.left_running = held  # type: ignore[method-assign]
        taking_over = asyncio.create_task(manager.reconciler.lead())
        await asyncio.wait_for(reading.wait(), 10)
        await manager.endpoints.update_config(NAME, _config("after", "2"))  # the change, while the new leader reads
        go.set()
        await asyncio.wait_for(taking_over, 10)
        stepping = asyncio.create_task(_lead_on(manager))
        backend.gate("models:/m/1").set()
        backend.gate("models:/m/2").set()
        await _until(lambda: store.get(NAME).config_update == "NOT_UPDATING", "the change never ended")
        await manager.rollouts.wait_settled(NAME)
        stepping.cancel()
        running, after = [r.running for r in backend.spawned], [*manager.live[NAME].replica_sets]
        await manager.shutdown()
        return running, after, store.get(NAME)

    running, after, record = asyncio.run(scenario())
    _check(backend, running, after, record)


def test_a_change_sent_while_the_takeover_brings_replicas_up_waits_for_it(tmp_path):
    store, backend = _stored(tmp_path), HeldBackend()

    async def scenario() -> tuple[str, list[bool], list[str], spec.EndpointRecord]:
        manager = _follower(store, backend, tmp_path)
        await manager.reconciler.lead()  # no replica left to adopt: the takeover starts one, held
        await _until(lambda: len(backend.spawned) == 1, "the takeover started no replica")
        await manager.endpoints.update_config(NAME, _config("after", "2"))  # the change, while the takeover runs
        backend.gate("models:/m/1").set()
        await _until(lambda: len(backend.spawned) == 2, "the change never started its replica")
        during = store.get(NAME).config_update  # the takeover has ended: it must not have ended the update
        backend.gate("models:/m/2").set()
        await manager.rollouts.wait_settled(NAME)
        running, after = [r.running for r in backend.spawned], [*manager.live[NAME].replica_sets]
        await manager.shutdown()
        return during, running, after, store.get(NAME)

    during, running, after, record = asyncio.run(scenario())
    assert during == "IN_PROGRESS", "the takeover's end was written as the end of the change"
    _check(backend, running, after, record)


def test_a_leader_that_lost_its_lease_hands_its_replicas_over_once_the_new_leaders_are_listed(tmp_path):
    """A gateway led and ran ``before``'s replica, then lost the lease while alive: as a follower it serves on its
    own replica until the replica table lists another gateway's replica of the entity, then routes there, stops
    its own and withdraws its row."""
    from serving.state.replica_table import ReplicaRow, ReplicaTable

    store, backend = _stored(tmp_path), HeldBackend()
    table = ReplicaTable(store.database)

    async def scenario() -> tuple[list[str], list[str], list[int]]:
        manager = _follower(store, backend, tmp_path)
        backend.gate("models:/m/1").set()
        await manager.reconciler.lead()
        await manager.rollouts.wait_settled(NAME)
        await manager.book.flush()
        manager.leading = False  # the lease is another's now
        manager.fence.drop()
        await manager.reconciler.follow()  # the new leader's replicas are not listed yet
        kept = [r.url for r in manager.live[NAME].replica_sets["before"].replicas]
        other = ReplicaRow(
            "local:127.0.0.1:4242:4242",
            "127.0.0.1",
            4242,
            4242,
            NAME,
            "before",
            "models:/m/1",
            "local",
            1.0,
            owner_pid=1,
        )
        table.replace(NAME, "before", "models:/m/1", 1, [other])  # the new leader (pid 1) lists its replica
        await manager.reconciler.follow()
        routed = [r.url for r in manager.live[NAME].replica_sets["before"].replicas]
        await _until(lambda: not backend.spawned[0].running, "the handed-over replica never stopped")
        await manager.book.flush()
        rows = sorted(r.pid for r in table.all())
        await manager.shutdown()
        return kept, routed, rows

    kept, routed, rows = asyncio.run(scenario())
    assert kept == ["http://127.0.0.1:1000"]  # its own replica served on
    assert routed == ["http://127.0.0.1:4242"]  # then the new leader's
    assert rows == [4242]  # its own row withdrawn, the new leader's kept


def test_a_followers_set_holds_a_burst_while_no_replica_is_listed_and_serves_it_once_one_is(tmp_path):
    """Between a replica's death and its replacement's row, a follower's set has nowhere to send: its queue holds
    what the leader's holds (the entity's ``max_queue``), not the dispatcher's default of 64, so a burst waits for
    the replacement instead of getting 429s."""
    from serving.protocol.wire import WireRequest
    from serving.state.replica_table import ReplicaRow, ReplicaTable
    from serving.traffic.dispatcher import AdmissionRefused

    store = _stored(tmp_path)
    table = ReplicaTable(store.database)

    async def scenario() -> tuple[int, list[object]]:
        manager = _follower(store, HeldBackend(), tmp_path)
        await manager.reconciler.follow()  # the table lists no replica of the entity
        dispatcher = manager.live[NAME].replica_sets["before"].dispatcher
        assert dispatcher is not None
        burst = [
            asyncio.ensure_future(dispatcher.submit(WireRequest(f"q{i}", "application/json", b"{}")))
            for i in range(200)
        ]
        await asyncio.sleep(0)
        refused_at_once = sum(1 for f in burst if f.done() and isinstance(f.exception(), AdmissionRefused))
        row = ReplicaRow(
            "local:127.0.0.1:4242:4242", "127.0.0.1", 4242, 4242, NAME, "before", "models:/m/1", "local", 1.0, 1
        )
        table.replace(NAME, "before", "models:/m/1", 1, [row])  # the leader lists the replacement
        await manager.reconciler.follow()
        answers = await asyncio.gather(*burst, return_exceptions=True)
        await manager.shutdown()
        return refused_at_once, answers

    refused_at_once, answers = asyncio.run(scenario())
    assert refused_at_once == 0
    failed = [a for a in answers if isinstance(a, BaseException)]
    assert not failed, f"{len(failed)} of 200 failed, first: {failed[0]!r}"
