"""One autoscaler for several gateways: a follower's load reaches the leader's samples (each request counted
once), and a new leader continues from the recorded policy state. Real endpoint managers, dispatchers and a
SQLite state file shared by two gateways' sides; the clocks are stepped by hand."""

from __future__ import annotations

import os

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.policy import PolicyState
from serving.autoscaler.record import from_record, to_record
from serving.autoscaler.signals import Sample
from serving.endpoints import spec, validation
from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from serving.gateway.autoscaling import LiveAutoscaler
from serving.gateway.shared_scaling import RemoteLoad, SharedScaling
from serving.replicas.replica_set import ReplicaSet
from serving.state.scaling import LoadBoard, Reading, ScalerRecords

KEY = ("e", "champion")
URI = "models:/m/1"


async def _never(replica, requests):  # pragma: no cover - nothing is dispatched in these tests
    raise AssertionError("no request is sent")


class Counts:
    """The controller's backend: records the counts asked for (no process is started)."""

    def __init__(self) -> None:
        self.asked: dict[tuple[str, str], int] = {}

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        self.asked[(endpoint, entity)] = n

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        return self.asked.get((endpoint, entity), 0)


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _gateway(tmp_path, name: str, *, leading: bool, wall: Clock, mono: Clock, scaling: ScalingConfig | None = None):
    store = EndpointStore(tmp_path / "endpoints.db")
    if not store.list():  # the endpoint in the store too: the leader records only a stored endpoint's state
        config = validation.normalize_config(
            spec.EndpointCoreConfig.model_validate(
                {"served_entities": [{"name": "champion", "entity_name": "m", "entity_version": "1"}]}
            ),
            "e",
        )
        store.create(
            spec.EndpointRecord(name="e", id="id-e", creator="test", created_ms=0, updated_ms=0, config=config)
        )
    manager = EndpointManager(store, lambda *a: "1", dict(os.environ), tmp_path / name, home=tmp_path / name)
    manager.leading = leading
    served = ReplicaSet(name="champion", model_name="m", version="1", scaling=scaling or ScalingConfig())
    served.attach(_never)
    manager.live["e"] = LiveEndpoint(replica_sets={"champion": served}, weights=[("champion", 100)])
    shared = SharedScaling(
        LoadBoard(store.database), ScalerRecords(store.database), name, lambda: manager.leading, clock=wall
    )
    return manager, served, LiveAutoscaler(manager, Counts(), clock=mono, wall=wall, shared=shared), shared


def _reading(gateway: str, at: float, arrivals: int, completed: int, **values) -> Reading:
    return Reading(
        gateway,
        "e",
        "champion",
        URI,
        at,
        {
            "in_flight": 3.0,
            "queue_depth": 1.0,
            "arrivals_total": arrivals,
            "completed_total": completed,
            "latency_p50_ms": 20.0,
            "latency_p99_ms": 50.0,
            **values,
        },
    )


def test_the_leader_adds_each_gateways_rates_and_sums_the_levels():
    own = Sample(
        t=10.0,
        in_flight=2.0,
        ready_replicas=1,
        queue_depth=1.0,
        requests=10,
        completed=9,
        latency_p50_ms=10.0,
        latency_p99_ms=30.0,
    )
    remote = RemoteLoad()
    first = remote.merged(own, URI, [_reading("b", 9.5, 100, 90)])
    assert (first.requests, first.completed) == (10, 9)  # no earlier reading from b: its rate is unknown
    assert first.in_flight == 5.0 and first.queue_depth == 2.0 and first.latency_p99_ms == 50.0
    later = remote.merged(own, URI, [_reading("b", 10.5, 130, 118)])
    assert (later.requests, later.completed) == (40, 37)
    assert later.latency_p50_ms == (10.0 * 9 + 20.0 * 28) / 37
    again = remote.merged(own, URI, [_reading("b", 10.5, 130, 118)])  # the same reading read twice: same rates
    assert (again.requests, again.completed) == (40, 37)
    missed = remote.merged(own, URI, [_reading("b", 12.5, 190, 178)])  # one reading missed: 2 s at 30 a second
    assert (missed.requests, missed.completed) == (40, 39)
    restarted = remote.merged(own, URI, [_reading("b", 13.5, 5, 5)])  # b restarted: its totals went back
    assert (restarted.requests, restarted.completed) == (10, 9)
    other_model = remote.merged(own, "models:/m/2", [_reading("b", 14.5, 200, 200)])
    assert other_model == own


def test_busy_clocks_take_the_latest_reading_of_each_replica():
    one, two = "local:127.0.0.1:9001:41", "local:127.0.0.1:9002:42"
    readings = [_reading("b", 1.0, 0, 0, busy={one: 3.0, two: 7.5}), _reading("c", 1.0, 0, 0, busy={one: 4.0})]
    assert RemoteLoad.busy_clocks(readings) == {one: 4.0, two: 7.5}


def test_a_followers_requests_reach_the_leaders_samples_through_the_store(tmp_path):
    wall, mono = Clock(1_000.0), Clock(50.0)
    _, follower_set, follower, follower_shared = _gateway(tmp_path, "b", leading=False, wall=wall, mono=mono)
    _, _, leader, leader_shared = _gateway(tmp_path, "a", leading=True, wall=wall, mono=mono)
    meter = follower_set.dispatcher.meter

    def second(arrivals: int) -> Sample:
        for _ in range(arrivals):
            meter.arrived(mono.t)
            meter.started(mono.t)
            meter.stopped(mono.t + 0.01)
            meter.finished(mono.t + 0.01, 0.01)
        wall.t += 1.0
        mono.t += 1.0
        follower.step()  # a follower offers its reading ...
        follower_shared.tick()  # ... its thread writes it
        leader_shared.tick()  # the leader's thread reads it
        return leader.signals.sample(mono.t)[KEY]

    assert second(5).requests == 0  # the first reading seen sets the baseline
    assert second(7).requests == 7
    assert second(0).requests == 0
    wall.t += 10.0  # the follower went quiet: its last reading is stale
    leader_shared.tick()
    assert leader.signals.sample(mono.t)[KEY].in_flight == 0.0


def test_a_new_leader_continues_from_the_recorded_state_of_the_same_model(tmp_path):
    wall, mono = Clock(5_000.0), Clock(100.0)
    config = ScalingConfig(vertical=False)
    _, _, old, old_shared = _gateway(tmp_path, "a", leading=True, wall=wall, mono=mono, scaling=config)
    old.sync()
    for _ in range(5):
        mono.t += 1.0
        wall.t += 1.0
        old.controller.step(mono.t)
    state = PolicyState(replicas=3, target=7.0, started_at=mono.t - 5, last_horizontal=mono.t - 1)
    old.controller.resume(KEY, state, [], mono.t)
    old._record(mono.t)
    old_shared.tick()

    wall.t += 2.0  # the new leader, on another clock, two seconds later
    new_mono = Clock(9.0)
    manager, _, new, new_shared = _gateway(tmp_path, "b", leading=True, wall=wall, mono=new_mono, scaling=config)
    new_shared.load_records()
    new.sync()
    resumed = new.controller.scalers[KEY]
    assert (resumed.state.replicas, resumed.state.target) == (3, 7.0)
    assert resumed.state.last_horizontal == new_mono.t - 3.0  # 1 s before the record, which is 2 s old
    assert len(resumed.history) == 5 and resumed.history.snapshot().last.t == new_mono.t - 2.0

    manager.live["e"].replica_sets["champion"] = ReplicaSet(
        name="champion", model_name="m", version="2", scaling=config
    )
    manager.live["e"].replica_sets["champion"].attach(_never)
    new.controller.remove(KEY)
    new._configs.clear()
    new.sync()  # another version under the same name: its own start
    fresh = new.controller.scalers[KEY]
    assert (fresh.state.replicas, fresh.state.target, len(fresh.history)) == (0, config.initial_target, 0)


def test_a_record_round_trips_with_its_times_moved():
    state = PolicyState(
        replicas=2, target=3.5, started_at=10.0, last_horizontal=None, last_vertical=12.0, last_busy=13.0, ceiling=9.0
    )
    samples = (
        Sample(t=11.0, in_flight=1.5, ready_replicas=2, ready_in_s=0.8),
        Sample(t=12.0, in_flight=2.0, ready_replicas=2, latency_p99_ms=40.0),
    )
    record = to_record(state, samples, shift=1_000.0)
    assert record["samples"][0]["t"] == 1_011.0 and record["policy"]["started_at"] == 1_010.0
    back, back_samples = from_record(record, ScalingConfig(initial_target=2.0, max_target=3.0), shift=-1_000.0)
    assert back.target == 3.0  # kept inside this config's bounds
    assert back.started_at == 10.0 and back.last_horizontal is None and back.ceiling == 9.0
    assert tuple(back_samples) == samples


def test_a_follower_sends_each_replica_what_the_leaders_record_allows(tmp_path):
    """The leader's policy sized the replicas for a few requests each: a follower's set, which would send the
    endpoint's default of 32, takes the limit of the leader's record (once the record is of the same model)."""
    wall, mono = Clock(2_000.0), Clock(10.0)
    config = ScalingConfig(vertical=False)
    _, leader_set, leader, leader_shared = _gateway(tmp_path, "a", leading=True, wall=wall, mono=mono, scaling=config)
    manager, follower_set, follower, follower_shared = _gateway(tmp_path, "b", leading=False, wall=wall, mono=mono)
    follower_set.followed = True
    leader.sync()
    leader_set.set_limits(max_concurrency=3)
    leader._record(mono.t)
    leader_shared.tick()

    assert follower_set.max_concurrency == 32
    follower_shared.tick()  # the follower's thread reads the records
    follower.step()
    assert follower_set.max_concurrency == 3

    other = ReplicaSet(name="champion", model_name="m", version="2")  # another version: not the record's
    other.followed = True
    other.attach(_never)
    manager.live["e"].replica_sets["champion"] = other
    follower.step()
    assert other.max_concurrency == 32


def test_when_a_gateway_that_shared_the_replicas_goes_the_others_take_its_share_at_once(tmp_path):
    """Two gateways each let a replica hold the policy's limit L. When one stops writing to the load board (killed,
    cut off), the other lets each replica hold 2 L from its next step, so the replicas keep the concurrency they
    served the whole load at; when it is back, each holds L again. The same on a follower whose leader went."""
    from serving.gateway.gateway_shares import MEMBER_FRESH_S

    wall, mono = Clock(2_000.0), Clock(10.0)
    config = ScalingConfig(vertical=False)
    _, leader_set, leader, leader_shared = _gateway(tmp_path, "a", leading=True, wall=wall, mono=mono, scaling=config)
    _, follower_set, follower, follower_shared = _gateway(tmp_path, "b", leading=False, wall=wall, mono=mono)
    follower_set.followed = True

    def second(*gateways) -> None:
        for autoscaler, shared in gateways:
            autoscaler.step()
            shared.tick()
        wall.t += 1.0
        mono.t += 1.0

    both = ((leader, leader_shared), (follower, follower_shared))
    second(*both)
    leader._record(mono.t)
    second(*both)
    second(*both)
    limit = leader._policy_limits[KEY]
    assert leader_set.max_concurrency == limit and follower_set.max_concurrency == limit

    wall.t += MEMBER_FRESH_S  # the follower is gone: its last reading grows old
    mono.t += MEMBER_FRESH_S
    second((leader, leader_shared))  # its tick finds the follower's reading old; the next step acts on it
    second((leader, leader_shared))
    assert leader_set.max_concurrency == 2 * limit
    for _ in range(3):  # back: it writes, the leader's next tick reads it, the step after acts on it
        second(*both)
    assert leader_set.max_concurrency == limit

    wall.t += MEMBER_FRESH_S  # now the leader is gone: the follower takes its share too
    mono.t += MEMBER_FRESH_S
    second((follower, follower_shared))
    second((follower, follower_shared))
    assert follower_set.max_concurrency == 2 * limit
