"""The autoscaler's shared state on both stores: each gateway's load readings (replaced per gateway, the
others' fresh ones read back, a stopped gateway's removed) and the leader's records (replaced per entity,
the old ones dropped, those of a deleted endpoint with it)."""

from __future__ import annotations

from serving.endpoints import spec, validation
from serving.endpoints.store import EndpointStore
from serving.state.scaling import LoadBoard, Reading, ScalerRecord, ScalerRecords

STATE = {"policy": {"replicas": 3, "target": 7.0}, "samples": [{"t": 1.0, "in_flight": 2.0, "ready_replicas": 1}]}


def _stored(database, *names: str) -> EndpointStore:  # type: ignore[no-untyped-def]
    """The endpoints ``names`` in the state store (a record is kept only for an endpoint it has)."""
    store = EndpointStore(database.url)
    for name in names:
        config = validation.normalize_config(
            spec.EndpointCoreConfig.model_validate(
                {"served_entities": [{"name": "x", "entity_name": "m", "entity_version": "1"}]}
            ),
            name,
        )
        store.create(
            spec.EndpointRecord(name=name, id=f"id-{name}", creator="test", created_ms=0, updated_ms=0, config=config)
        )
    return store


def _reading(gateway: str, entity: str, at: float, n: int) -> Reading:
    return Reading(gateway, "e", entity, "models:/m/1", at, {"arrivals_total": n, "busy": {"12": 1.5}})


def test_each_gateway_replaces_its_own_readings_and_reads_the_others_fresh_ones(state_database) -> None:
    board = LoadBoard(state_database)
    board.publish("a", [_reading("a", "x", 100.0, 1), _reading("a", "y", 100.0, 2)])
    board.publish("b", [_reading("b", "x", 100.5, 3)])
    board.publish("c", [_reading("c", "x", 90.0, 4)])  # stale: from a gateway gone quiet
    board.publish("a", [_reading("a", "x", 101.0, 5)])  # a no longer serves y
    seen = board.others("b", since=95.0)
    assert sorted((r.gateway, r.entity, r.values["arrivals_total"]) for r in seen) == [("a", "x", 5)]
    assert seen[0].values["busy"] == {"12": 1.5} and seen[0].model_uri == "models:/m/1"
    assert [r.gateway for r in board.others("a", since=95.0)] == ["b"]
    board.forget("b")
    assert board.others("a", since=0.0) == [_reading("c", "x", 90.0, 4)]


def test_the_leaders_records_are_replaced_per_entity_and_dropped_with_their_entity(state_database) -> None:
    _stored(state_database, "e").close()
    records = ScalerRecords(state_database)
    state = STATE
    records.save(
        [ScalerRecord("e", "x", "models:/m/1", 10.0, state), ScalerRecord("e", "y", "models:/m/1", 10.0, state)]
    )
    records.save([ScalerRecord("e", "x", "models:/m/2", 15.0, {**state, "policy": {"replicas": 4, "target": 7.0}})])
    found = records.load()
    assert found[("e", "x")].model_uri == "models:/m/2" and found[("e", "x")].state["policy"]["replicas"] == 4
    assert found[("e", "y")].state == state
    records.forget(before=12.0)  # y was last saved at 10
    assert list(records.load()) == [("e", "x")]


def test_a_deleted_endpoints_records_go_with_it_and_one_saved_after_the_delete_is_dropped(state_database) -> None:
    """An endpoint deleted and created again under its name is a new endpoint: a gateway started after that must
    not continue its autoscaler from the old one's learned target and load window."""
    store = _stored(state_database, "e", "f")
    records = ScalerRecords(state_database)
    records.save(
        [ScalerRecord("e", "x", "models:/m/1", 10.0, STATE), ScalerRecord("f", "x", "models:/m/1", 10.0, STATE)]
    )
    store.delete("e")
    assert list(records.load()) == [("f", "x")]
    # the leader's thread saves what it took a moment before the delete
    records.save(
        [ScalerRecord("e", "x", "models:/m/1", 11.0, STATE), ScalerRecord("f", "x", "models:/m/1", 11.0, STATE)]
    )
    assert list(records.load()) == [("f", "x")] and records.load()[("f", "x")].at == 11.0
    records.save([ScalerRecord("e", "x", "models:/m/1", 12.0, STATE)])  # nothing left to save: no error
    _stored(state_database, "e").close()  # created again: its records start afresh
    assert ("e", "x") not in records.load()
    store.close()
