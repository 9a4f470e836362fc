"""Staged rollouts to a device group: the pure decision (``serving.edge.rollouts``) and the fleet's records of it in
the state store (``serving.edge.fleet``, on SQLite here and PostgreSQL in the edge's end-to-end test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.edge.fleet import Fleet
from serving.edge.rollouts import (
    ABORTED,
    COMPLETED,
    RUNNING,
    SUPERSEDED,
    DeviceView,
    RolloutConfigError,
    RolloutPolicy,
    decide,
    stage_members,
)
from serving.endpoints.store import EndpointStore
from serving.protocol.errors import ApiError


def _view(device: str, version: str | None = None, rejected: tuple[str, ...] = (), seen: float | None = 0.0):
    return DeviceView(device, version, frozenset(rejected), seen)


def test_the_policy_names_a_bad_field() -> None:
    for bad, field in (
        ({"stages": (0.5, 0.2, 1.0)}, "stages"),
        ({"stages": (0.1, 0.5)}, "stages"),
        ({"failure_share": 0}, "abort.failure_share"),
        ({"min_devices": 0}, "abort.min_devices"),
    ):
        with pytest.raises(RolloutConfigError, match=field):
            RolloutPolicy(**bad)


def test_stages_take_in_their_share_of_the_group_in_an_order_two_gateways_agree_on() -> None:
    group = [f"d{i}" for i in range(10)]
    first = stage_members("r1", 0.1, group, [])
    assert len(first) == 1 and first == stage_members("r1", 0.1, list(reversed(group)), [])
    second = stage_members("r1", 0.5, group, first)
    assert len(second) == 4 and not set(second) & set(first)
    assert len(stage_members("r1", 1.0, group, first + second)) == 5


def test_a_stage_advances_once_its_online_devices_serve_the_version_and_an_offline_one_holds_nothing_up() -> None:
    policy = RolloutPolicy(stages=(0.5, 1.0), offline_after_s=30)
    members = {"a": _view("a", "1", seen=100.0), "b": _view("b", "1", seen=100.0)}
    assert decide(policy, "2", 0, members, now=101.0).action == "wait"
    members["a"] = _view("a", "2", seen=101.0)
    assert decide(policy, "2", 0, members, now=102.0).action == "wait"  # b is online and not there yet
    members["b"] = _view("b", "1", seen=50.0)  # b went quiet 52 s ago: offline
    assert decide(policy, "2", 0, members, now=102.0).action == "advance"
    assert decide(policy, "2", 1, members, now=102.0).action == "complete"


def test_the_rollout_aborts_once_the_failed_share_of_finished_devices_reaches_the_threshold() -> None:
    policy = RolloutPolicy(failure_share=0.5, min_devices=2)
    one_failed = {"a": _view("a", "1", rejected=("2",)), "b": _view("b", "1")}
    assert decide(policy, "2", 0, one_failed, now=1.0).action == "wait"  # one finished: under min_devices
    two = {**one_failed, "b": _view("b", "2")}
    decision = decide(policy, "2", 0, two, now=1.0)
    assert decision.action == "abort" and "1 of 2 devices failed" in decision.reason


@pytest.fixture
def fleet(tmp_path: Path):
    store = EndpointStore(tmp_path / "state.db")
    yield Fleet(store.database)
    store.close()


def _report(fleet: Fleet, device: str, version: str | None, now: float, rejected: dict | None = None) -> None:
    fleet.report(device, {"version": version, "rejected": rejected or {}}, now)


def test_a_rollout_moves_stage_by_stage_on_reports_and_an_abort_sends_the_group_back(fleet: Fleet) -> None:
    devices = [f"d{i}" for i in range(4)]
    tokens = {d: fleet.register(d, "shops", now=0.0) for d in devices}
    assert fleet.authenticate("d0", tokens["d0"]) == "shops" and fleet.authenticate("d0", tokens["d1"]) is None
    with pytest.raises(ApiError, match="registered already"):
        fleet.register("d0", "shops", now=0.0)
    assert fleet.desired("d0", "shops") is None

    first = fleet.start("shops", "fraud", "1", RolloutPolicy(stages=(0.25, 1.0)), now=1.0)
    _, stages = fleet.rollout(first.id)
    (canary,) = stages
    assert fleet.desired(canary, "shops") == ("fraud", "1")
    others = [d for d in devices if d != canary]
    assert all(fleet.desired(d, "shops") is None for d in others)  # the group had nothing before
    _report(fleet, canary, "1", now=2.0)
    assert fleet.rollout(first.id)[0].stage == 1  # stage 1 done: every device taken in
    assert all(fleet.desired(d, "shops") == ("fraud", "1") for d in devices)
    for d in others:
        _report(fleet, d, "1", now=3.0)
    assert fleet.rollout(first.id)[0].state == COMPLETED

    bad = fleet.start("shops", "fraud", "2", RolloutPolicy(stages=(0.25, 1.0)), now=4.0)
    assert bad.previous_version == "1"
    (canary,) = fleet.rollout(bad.id)[1]
    _report(fleet, canary, "1", now=5.0, rejected={"2": "smoke test: answers differ"})
    after = fleet.rollout(bad.id)[0]
    assert after.state == ABORTED and "1 of 1 devices failed" in after.reason
    assert all(fleet.desired(d, "shops") == ("fraud", "1") for d in devices)
    assert fleet.bundles_for("shops") == {("fraud", "1"), ("fraud", "2")}

    running = fleet.start("shops", "fraud", "3", RolloutPolicy(), now=6.0)
    newer = fleet.start("shops", "fraud", "4", RolloutPolicy(), now=7.0)
    assert fleet.rollout(running.id)[0].state == SUPERSEDED and newer.state == RUNNING
    assert newer.previous_version == "1"  # what the devices outside its stages serve
    with pytest.raises(ApiError, match="serves model fraud"):
        fleet.start("shops", "other", "1", RolloutPolicy(), now=8.0)
    with pytest.raises(ApiError, match="has no devices"):
        fleet.start("nowhere", "fraud", "1", RolloutPolicy(), now=8.0)
    assert fleet.abort(newer.id, "by hand", now=9.0).state == ABORTED
    with pytest.raises(ApiError, match="not running"):
        fleet.abort(newer.id, "again", now=9.0)


def test_telemetry_taken_once_per_record_and_a_new_stream_starts_over(fleet: Fleet) -> None:
    fleet.register("d0", "shops", now=0.0)
    assert fleet.take_telemetry("d0", 7, [1, 2, 3]) == {1, 2, 3}
    assert fleet.take_telemetry("d0", 7, [2, 3, 4]) == {4}  # a retried batch: only the record not taken
    assert fleet.take_telemetry("d0", 8, [1, 2]) == {1, 2}  # the device's buffer was made anew


def test_the_bundle_command_refuses_a_tolerance_that_is_not_positive(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.edge_bundle import main

    with pytest.raises(SystemExit):
        main(["--tolerance", "0"])
    assert "--tolerance must be positive" in capsys.readouterr().err


def test_a_stage_takes_online_devices_first_so_it_never_waits_on_offline_ones_alone(fleet: Fleet) -> None:
    """Four devices, three seen lately and one silent: whatever the rollout's hash order, its one-device first
    stage is an online device, and the rollout moves once that device serves the version."""
    for i in range(4):
        fleet.register(f"d{i}", "shops", now=0.0)
    for i in range(3):
        _report(fleet, f"d{i}", "1", now=100.0)
    for attempt in range(8):  # eight rollouts: eight hash orders
        started = fleet.start("shops", "fraud", str(10 + attempt), RolloutPolicy(stages=(0.25, 1.0)), now=101.0)
        (canary,) = fleet.rollout(started.id)[1]
        assert canary != "d3"
    _report(fleet, canary, str(17), now=102.0)
    assert fleet.rollout(started.id)[0].stage == 1
