"""The gateway's queue under the live autoscaler: the policy's SLO bound with ``shed_load``, else
``max_queue``. A real endpoint manager and dispatcher (no replica process is needed: nothing is sent)."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from serving.autoscaler.config import ScalingConfig
from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from serving.gateway.autoscaling import LiveAutoscaler
from serving.replicas.replica_set import ReplicaSet
from tests.waiting import until_async


async def _never(replica, requests):  # pragma: no cover - nothing is dispatched in these tests
    raise AssertionError("no request is sent")


@pytest.mark.parametrize(("shed", "expected"), [(True, 7), (False, 500)])
def test_the_queue_takes_the_policy_bound_only_when_shedding(tmp_path, shed, expected):
    manager = EndpointManager(
        EndpointStore(tmp_path / "endpoints.db"), lambda *a: "1", dict(os.environ), tmp_path / "logs", home=tmp_path
    )
    served = ReplicaSet(
        name="champion", model_name="m", version="1", scaling=ScalingConfig(max_queue=500, shed_load=shed)
    )
    served.attach(_never)
    manager.live["e"] = LiveEndpoint(replica_sets={"champion": served}, weights=[("champion", 100)])
    autoscaler = LiveAutoscaler(manager)
    autoscaler.sync()
    assert served.dispatcher.max_queue == 500  # held up to max_queue until the policy has measured anything
    autoscaler.controller.queue_sink("e", "champion", 7)
    assert served.dispatcher.max_queue == expected


def test_shed_load_must_be_a_boolean():
    with pytest.raises(ValueError, match="shed_load: must be true or false"):
        ScalingConfig.from_mapping({"shed_load": "yes"})


def test_a_poke_right_after_a_step_still_steps_within_the_gap(tmp_path):
    # a request that finds no replica pokes the autoscaler; a poke within 50 ms of the last step steps once the
    # gap has passed, never dropped: scale from zero would wait for the next 1-s tick
    import asyncio

    gap = 0.05  # serving.gateway.autoscaling.POKE_GAP_S
    manager = EndpointManager(
        EndpointStore(tmp_path / "endpoints.db"), lambda *a: "1", dict(os.environ), tmp_path / "logs", home=tmp_path
    )
    autoscaler = LiveAutoscaler(manager)
    steps: list[float] = []
    real_step = autoscaler.step

    def counted() -> None:
        steps.append(autoscaler.clock())
        real_step()

    autoscaler.step = counted

    async def scenario() -> None:
        counted()  # a regular tick
        autoscaler.poke()  # at once after it
        autoscaler.poke()  # a second poke while one is pending adds nothing
        await until_async(lambda: len(steps) == 2, "the poke within the gap never stepped")
        # twice the gap after that step: time enough for a step the second poke would wrongly add
        await until_async(lambda: autoscaler.clock() >= steps[1] + 2 * gap, "the clock stood still")
        assert len(steps) == 2
        autoscaler.poke()  # long after: at once
        await until_async(lambda: len(steps) == 3, "the poke long after a step never stepped")

    asyncio.run(scenario())
    assert len(steps) == 3
    assert steps[1] - steps[0] >= gap - 0.005
    assert steps[2] - steps[1] < 0.5


def test_load_that_starts_after_idle_seconds_is_bounded_by_the_rate_the_replicas_showed():
    """Four idle seconds, then one second serving 300 requests (one at a time, 3 ms each): the queue bound is what
    300/s serves within 80 % of the 500 ms SLO, not what the interval's average (60/s) would."""
    from serving.autoscaler.load import queue_bound
    from serving.autoscaler.signals import Sample, Signals
    from serving.autoscaler.vertical import LATENCY_GOAL

    idle = [Sample(t=float(t), in_flight=0.0, ready_replicas=1, replicas=1) for t in range(1, 5)]
    busy = Sample(t=5.0, in_flight=1.0, ready_replicas=1, replicas=1, requests=300, completed=300, queue_depth=0.1)
    bound = queue_bound(ScalingConfig(), Signals((*idle, busy)), now=5.0, goal=LATENCY_GOAL)
    assert bound >= 100  # 300/s x (0.4 s - 15 ms): four clients are far from an overload


def test_a_rate_measured_on_a_request_or_two_holds_the_queue_instead_of_shedding():
    """One request served in an idle interval (a warm-up, the first second after idle) is no measure of what the
    replicas serve: the queue holds up to max_queue until MIN_MEASURED requests were served in the interval."""
    from serving.autoscaler.load import MIN_MEASURED, queue_bound
    from serving.autoscaler.signals import Sample, Signals
    from serving.autoscaler.vertical import LATENCY_GOAL

    idle = [Sample(t=float(t), in_flight=0.0, ready_replicas=1, replicas=1) for t in range(1, 5)]
    one = Sample(t=5.0, in_flight=1.0, ready_replicas=1, replicas=1, requests=1, completed=1)
    config = ScalingConfig(max_queue=500)
    assert queue_bound(config, Signals((*idle, one)), now=5.0, goal=LATENCY_GOAL) == 500
    enough = Sample(t=5.0, in_flight=1.0, ready_replicas=1, replicas=1, requests=MIN_MEASURED, completed=MIN_MEASURED)
    assert queue_bound(config, Signals((*idle, enough)), now=5.0, goal=LATENCY_GOAL) < 500


def test_a_second_in_which_load_only_began_is_scaled_by_the_replicas_busy_share():
    """Load that begins late in a second: 30 answers while the replica was busy a tenth of it (3 ms each). The
    replica serves 300/s, not 30/s: 17 closed-loop clients on it are no overload, and the bound holds them."""
    from serving.autoscaler.load import queue_bound
    from serving.autoscaler.signals import Sample, Signals
    from serving.autoscaler.vertical import LATENCY_GOAL

    idle = [Sample(t=float(t), in_flight=0.0, ready_replicas=1, replicas=1, utilisation=0.0) for t in range(1, 5)]
    late = Sample(
        t=5.0, in_flight=0.1, ready_replicas=1, replicas=1, requests=30, completed=30, queue_depth=0.01, utilisation=0.1
    )
    assert queue_bound(ScalingConfig(), Signals((*idle, late)), now=5.0, goal=LATENCY_GOAL) >= 100
    saturated = replace(late, requests=300, completed=300, in_flight=17.0, queue_depth=16.0, utilisation=1.0)
    overload = queue_bound(ScalingConfig(), Signals((*idle, saturated)), now=5.0, goal=LATENCY_GOAL)
    assert overload == queue_bound(
        ScalingConfig(), Signals((*idle, replace(saturated, utilisation=None))), 5.0, LATENCY_GOAL
    )


def test_a_new_leaders_first_second_is_read_with_the_recorded_seconds_before_it():
    """A leader that took over has its predecessor's recorded seconds (300 answers a second, both gateways' load),
    which end before the takeover, then its own first partial second (40 answers): the bound is read over the
    recorded seconds too, not over that one second alone."""
    from serving.autoscaler.load import queue_bound
    from serving.autoscaler.signals import Sample, Signals
    from serving.autoscaler.vertical import LATENCY_GOAL

    recorded = [
        Sample(t=float(t), in_flight=2.0, ready_replicas=2, replicas=2, requests=300, completed=300, utilisation=0.6)
        for t in range(1, 6)
    ]
    first = Sample(t=12.0, in_flight=2.0, ready_replicas=2, replicas=2, requests=40, completed=40, utilisation=None)
    alone = queue_bound(ScalingConfig(), Signals((first,)), now=12.0, goal=LATENCY_GOAL)
    after_takeover = queue_bound(ScalingConfig(), Signals((*recorded, first)), now=12.0, goal=LATENCY_GOAL)
    assert alone < 20 and after_takeover >= 100
