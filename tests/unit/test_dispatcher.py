"""The gateway's dispatcher: admission, the bounded queue (429 + Retry-After past it), micro-batches to
the least-loaded replica, retry on an unreachable replica, 504 on a slow one.

The gateway runs in-process; its replicas are a seam (``FakeReplicas.send``) answering each request
of an envelope after a delay. The real-replica path is covered by the e2e tests."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from serving.gateway.auth import Tokens
from serving.inference_log import read_inference_log
from serving.protocol.errors import ApiError
from serving.protocol.wire import WireRequest
from serving.traffic.batching import BatchPlan
from serving.traffic.dispatcher import AdmissionRefused, Dispatcher
from tests.fakes import FakeReplica, FakeReplicas, in_process_gateway
from tests.waiting import until_async

TOKEN = "unit-test-admin-token-0123456789"
BATCHING = BatchPlan(enabled=True, max_batch=8, max_wait_ms=0.0, single_ms=1.0, gain=5.0)


def gateway(tmp_path, replicas: FakeReplicas, *, max_queue: int, max_wait_s: float, limit: int = 1):
    app = in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}), replicas=replicas, limit=limit)
    dispatcher = app.state.manager.live["ep"].replica_sets["m-1"].dispatcher
    dispatcher.max_queue, dispatcher.max_wait_s = max_queue, max_wait_s
    return app


def burst(client: TestClient, n: int) -> list[httpx.Response]:
    def one(_: int) -> httpx.Response:
        return client.post(
            "/serving-endpoints/ep/invocations",
            content=json.dumps({"inputs": [[1]]}),
            headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        )

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def test_excess_beyond_the_queue_gets_429_with_retry_after_and_the_rest_is_served(tmp_path):
    replicas = FakeReplicas(delay_s=0.3)
    app = gateway(tmp_path, replicas, max_queue=2, max_wait_s=5)
    with TestClient(app) as client:
        replies = burst(client, 5)
        app.state.manager.live.clear()  # no replica processes to stop at shutdown
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 200, 200, 429, 429]
    refused = [r for r in replies if r.status_code == 429]
    assert all(r.headers["Retry-After"] == "1" and r.json()["error_code"] == "REQUEST_LIMIT_EXCEEDED" for r in refused)
    served = [r for r in replies if r.status_code == 200]
    assert all(r.headers["served-model-name"] == "m-1" for r in served)
    assert all(r.json() == {"predictions": [r.headers["x-request-id"]]} for r in served)  # each gets its own answer
    assert [len(ids) for _, ids in replicas.batches] == [1, 1, 1]  # batching off: one at a time, behind a limit of one
    logged = read_inference_log(tmp_path / "log", endpoint="ep")
    assert sorted(logged["status_code"]) == codes  # rejected requests are logged too


def test_a_queued_request_that_waits_too_long_is_refused(tmp_path):
    app = gateway(tmp_path, FakeReplicas(delay_s=0.3), max_queue=10, max_wait_s=0.1)
    with TestClient(app) as client:
        replies = burst(client, 3)
        app.state.manager.live.clear()
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 429, 429]
    assert any("within 0.1s" in r.json()["message"] for r in replies if r.status_code == 429)


def test_a_request_whose_entity_is_replaced_while_it_waits_is_routed_by_the_new_config(tmp_path):
    """The entity's only replica cannot be reached, and a config change replaces the entity meanwhile (its set
    stops): the request, refused by the old set, goes once more through the endpoint's new routing."""
    from serving.endpoints.live import LiveEndpoint
    from serving.replicas.replica_set import ReplicaSet

    replicas = FakeReplicas(delay_s=0.0)
    new = ReplicaSet("m-2", "m", "2", replicas=[FakeReplica("http://new")])
    new.attach(replicas.send)

    async def send(replica, requests):  # type: ignore[no-untyped-def]
        if replica.url == "http://replica":  # the config change lands while the request is on the old entity
            manager.live["ep"] = LiveEndpoint({"m-2": new}, [("m-2", 100)])
        return await replicas.send(replica, requests)

    app = in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}), replicas=replicas, send=send)
    manager = app.state.manager
    old = manager.live["ep"].replica_sets["m-1"]
    old.replicas[0].reachable = False
    old.dispatcher.max_wait_s = 0.2
    with TestClient(app) as client:
        reply = client.post(
            "/serving-endpoints/ep/invocations",
            content=json.dumps({"inputs": [[1]]}),
            headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
        )
        manager.live.clear()
    assert reply.status_code == 200, reply.text
    assert reply.headers["served-model-name"] == "m-2"
    assert [url for url, _ in replicas.batches] == ["http://replica", "http://new"]


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


def test_waiting_requests_go_as_one_batch_and_each_gets_its_own_answer():
    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.05)
        replica = FakeReplica("r")
        dispatcher = Dispatcher(replicas.send, lambda: [replica], limit=lambda: 64)
        dispatcher.plan = BATCHING
        answers = await asyncio.gather(
            *(dispatcher.submit(WireRequest(f"q{i}", "application/json", b"{}")) for i in range(19))
        )
        return replicas.batches, answers, replica.outstanding

    batches, answers, outstanding = run(scenario())
    assert [json.loads(a.first) for a in answers] == [[f"q{i}"] for i in range(19)]
    # the first request goes alone (the replica was idle), the second fills the second pipeline slot,
    # then the others wait and leave in batches of at most 8
    assert [len(ids) for _, ids in batches] == [1, 1, 8, 8, 1]
    assert [i for _, ids in batches for i in ids] == [f"q{i}" for i in range(19)]  # first come, first served
    assert outstanding == 0


def test_requests_submitted_together_leave_in_full_batches_and_overflow_is_refused_each():
    """A stream's micro-batch: the 19 requests above, submitted together, leave as 8, 8, 3 (not 1, 1, 8, 8, 1);
    with no replica free and the queue bounded, each request past the bound gets its own AdmissionRefused."""

    async def scenario(busy: bool):  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.05)
        replica = FakeReplica("r", outstanding=1 if busy else 0)
        dispatcher = Dispatcher(replicas.send, lambda: [replica], limit=lambda: 1 if busy else 64, max_queue=16)
        dispatcher.plan = BATCHING
        requests = [WireRequest(f"q{i}", "application/json", b"{}") for i in range(19)]
        if busy:
            task = asyncio.ensure_future(dispatcher.submit_many(requests))
            await until_async(lambda: dispatcher.waiting == 16, "the 16 requests within the bound never queued")
            replica.outstanding = 0  # the replica frees up: the 16 admitted ones go
            dispatcher.capacity_changed()
            return replicas.batches, await task
        return replicas.batches, await dispatcher.submit_many(requests)

    batches, answers = run(scenario(busy=False))
    assert [len(ids) for _, ids in batches] == [8, 8, 3]
    assert [json.loads(a.first) for a in answers] == [[f"q{i}"] for i in range(19)]
    batches, answers = run(scenario(busy=True))
    assert [json.loads(a.first) for a in answers[:16]] == [[f"q{i}"] for i in range(16)]
    assert all(isinstance(a, AdmissionRefused) for a in answers[16:]) and len(answers) == 19


def test_a_lone_request_is_never_held_for_company():
    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.0)
        replica = FakeReplica("r")
        dispatcher = Dispatcher(replicas.send, lambda: [replica], limit=lambda: 64)
        dispatcher.plan = BatchPlan(enabled=True, max_batch=8, max_wait_ms=10_000.0, single_ms=1.0, gain=5.0)
        task = asyncio.ensure_future(dispatcher.submit(WireRequest("alone", "application/json", b"{}")))
        for _ in range(3):  # a few turns of the loop, no timer: the request is already on its way
            await asyncio.sleep(0)
        sent = list(replicas.batches)
        await task
        return sent

    assert run(scenario()) == [("r", ["alone"])]


def test_the_least_loaded_replica_gets_the_batch_and_an_unreachable_one_is_retried_elsewhere():
    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.01)
        down, up = FakeReplica("down", reachable=False), FakeReplica("up", outstanding=3)
        dispatcher = Dispatcher(replicas.send, lambda: [up, down], limit=lambda: 64)
        answer = await dispatcher.submit(WireRequest("q", "application/json", b"{}"))
        return replicas.batches, answer, dispatcher.stats.retried

    batches, answer, retried = run(scenario())
    assert batches == [("down", ["q"]), ("up", ["q"])]  # fewest outstanding first; then retried once on the other
    assert answer.status == 200 and retried == 1


def test_a_lost_replicas_requests_wait_for_its_replacement_instead_of_failing():
    """The only replica dies with a request on it: its owner is told, the request goes back to the queue, and
    while the replacement starts new requests are held past ``max_wait_s`` and past a shedding bound of 0; all
    are answered by the replacement."""

    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.01)
        dead = FakeReplica("dead", reachable=False)
        current = [dead]
        lost: list[str] = []
        dispatcher = Dispatcher(replicas.send, lambda: current, limit=lambda: 4, max_queue=0, max_wait_s=0.05)
        dispatcher.queue_cap = 100
        starting = {"n": 0}

        def on_lost(replica):  # type: ignore[no-untyped-def]
            lost.append(replica.url)
            replica.up = False
            current.remove(replica)
            starting["n"] += 1

        dispatcher.on_lost = on_lost
        dispatcher.replacing = lambda: starting["n"] > 0
        first = asyncio.ensure_future(dispatcher.submit(WireRequest("in-flight", "application/json", b"{}")))
        await until_async(lambda: bool(lost), "the dispatcher told the owner", timeout_s=5)
        later = [
            asyncio.ensure_future(dispatcher.submit(WireRequest(f"new{i}", "application/json", b"{}")))
            for i in range(3)
        ]
        await asyncio.sleep(0.2)  # the window under test, four times max_wait_s: nothing is refused in it
        assert not first.done() and not any(f.done() for f in later)
        current.append(FakeReplica("replacement"))
        starting["n"] = 0
        dispatcher.capacity_changed()
        answers = await asyncio.gather(first, *later)
        return lost, answers, replicas.batches

    lost, answers, batches = run(scenario())
    assert lost == ["dead"]
    assert [a.status for a in answers] == [200] * 4
    assert batches[0] == ("dead", ["in-flight"])
    assert sorted(i for url, ids in batches[1:] for i in ids if url == "replacement") == [
        "in-flight",
        "new0",
        "new1",
        "new2",
    ]


def test_without_a_replacement_a_lost_replicas_request_answers_503_once_its_wait_runs_out():
    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.0)
        dispatcher = Dispatcher(replicas.send, lambda: [FakeReplica("a", reachable=False)], max_wait_s=0.1)
        await dispatcher.submit(WireRequest("q", "application/json", b"{}"))

    with pytest.raises(ApiError) as err:
        run(scenario())
    assert err.value.status_code == 503
    assert err.value.message == "no replica of this endpoint could be reached"


def test_the_busy_clock_a_reply_carries_is_kept_per_replica_until_the_replica_leaves():
    # the autoscaler's utilisation comes back in the client's reply; the dispatcher keeps the last reading
    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.0)
        a, b = FakeReplica("a"), FakeReplica("b")
        current = [a, b]
        dispatcher = Dispatcher(replicas.send, lambda: current, limit=lambda: 1)
        assert dispatcher.busy_clocks() == {}
        await asyncio.gather(*(dispatcher.submit(WireRequest(f"q{i}", "application/json", b"{}")) for i in range(3)))
        readings = dispatcher.busy_clocks()
        current.remove(b)
        return readings, dispatcher.busy_clocks(), a.id, b.id

    readings, after, a, b = run(scenario())
    assert set(readings) == {a, b}  # each replica's own reading
    assert max(readings.values()) == 0.75  # three replies (0.25, 0.5, 0.75): the last one's reading is kept
    assert after == {a: readings[a]}  # b left: its reading is dropped


def test_requests_sent_to_a_replica_behind_the_call_it_predicts_are_metered_as_queued():
    """A replica predicts one call at a time: of four calls sent to it at once, one is in service and three wait
    inside it, so the meter's queue depth holds them (what the autoscaler's service time leaves out)."""

    async def scenario():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.2)
        replica = FakeReplica("r")
        dispatcher = Dispatcher(replicas.send, lambda: [replica], limit=lambda: 4)
        dispatcher.meter.read(time.monotonic())
        await asyncio.gather(*(dispatcher.submit(WireRequest(f"q{i}", "application/json", b"{}")) for i in range(4)))
        return dispatcher.meter.read(time.monotonic()), dispatcher.meter.serving

    reading, serving = run(scenario())
    assert reading.completed == 4 and serving == 0
    assert reading.queue_depth / reading.in_flight == pytest.approx(0.75, abs=0.05)


def test_no_reachable_replica_is_a_503_and_a_slow_one_a_504():
    async def unreachable():  # type: ignore[no-untyped-def]
        replicas = FakeReplicas(delay_s=0.0)
        dispatcher = Dispatcher(
            replicas.send, lambda: [FakeReplica("a", reachable=False), FakeReplica("b", reachable=False)]
        )
        await dispatcher.submit(WireRequest("q", "application/json", b"{}"))

    with pytest.raises(ApiError) as err:
        run(unreachable())
    assert err.value.status_code == 503

    async def slow():  # type: ignore[no-untyped-def]
        dispatcher = Dispatcher(FakeReplicas(delay_s=5).send, lambda: [FakeReplica("a")], timeout_s=0.05)
        await dispatcher.submit(WireRequest("q", "application/json", b"{}"))

    with pytest.raises(ApiError) as err:
        run(slow())
    assert err.value.status_code == 504


def test_bad_limits_are_refused_and_a_full_queue_refuses_at_once():
    with pytest.raises(ValueError):
        Dispatcher(FakeReplicas().send, list, max_queue=-1)

    async def full():  # type: ignore[no-untyped-def]
        dispatcher = Dispatcher(
            FakeReplicas().send, lambda: [FakeReplica("a", outstanding=1)], limit=lambda: 1, max_queue=0
        )
        await dispatcher.submit(WireRequest("q", "application/json", b"{}"))

    with pytest.raises(AdmissionRefused):
        run(full())
