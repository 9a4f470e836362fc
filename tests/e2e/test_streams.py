"""Stream inputs end to end: a real redis-server (append-only file on), a real gateway process and replicas of the
world's champion, which reads its features online through its FeatureService. Events are the world's
transactions (``customer_id``, ``merchant_id``, ``amount`` as strings, what a producer writes to a stream).

Holds:
- every event gets exactly one entry in the sink (its prediction, model version and served entity) or, if it is
  bad (a missing field, a value of the wrong type, an unknown customer), exactly one in the dead-letter stream
  with a reason naming what is wrong and never the value; the rest of the stream is scored past it; scored
  events are in the inference log under their event ids; the lag and the outcomes are Prometheus metrics;
- Redis restarted mid-stream (SIGTERM, then started on its data): consumption resumes; nothing lost or doubled;
- ``kill -9`` of the gateway in the middle of 100,000 events, then a new gateway on the same state: every event
  has exactly one result, none missing, none doubled.
"""

from __future__ import annotations

import collections
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest
import redis
from mlflow import MlflowClient
from prometheus_client.parser import text_string_to_metric_families

from feature_repo import synthetic
from infra.redis import RedisServer
from serving.gateway.process import GatewayProcess, environ_with, start_gateway, wait_endpoint_ready
from serving.inference_log import read_inference_log
from serving.replicas.local import free_port
from tests.gateways import ENTITY, own_state

pytestmark = pytest.mark.slow

ENDPOINT = "fraud-stream"
SOURCE, SINK, DEAD = "tx", "scores", "tx-dead"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(free_port(), tmp_path_factory.mktemp("redis")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def rows(world) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    tx = synthetic.read_transactions(world.settings.data_dir)
    return (
        tx[["customer_id", "merchant_id", "amount"]]
        .drop_duplicates(["customer_id", "merchant_id"])
        .reset_index(drop=True)
    )


@pytest.fixture(scope="module")
def gateway_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The module's gateways: a state store of their own, which the crash test's successor restores."""
    return environ_with({"TOLLFREE_WARM_POOL": "0", **own_state(tmp_path_factory.mktemp("state"))})


@pytest.fixture(scope="module")
def gateway(world, broker: RedisServer, gateway_env: dict[str, str]) -> Iterator[list[GatewayProcess]]:  # type: ignore[no-untyped-def]
    """The gateway, as a list: the crash test puts its successor in its place (the fixture stops the last)."""
    token = gateway_env["TOLLFREE_TOKEN"]
    running = [start_gateway(gateway_env, world.home / "logs" / "gateway-streams.log", timeout_s=240)]
    stream = {
        "source": f"{broker.url}/{SOURCE}",
        "sink": f"{broker.url}/{SINK}",
        "dead_letter": f"{broker.url}/{DEAD}",
        "group": "scorers",
        "batch_size": 64,
        "max_wait_ms": 5,
    }
    try:
        with _api(running[0], token) as api:
            created = api.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": ENDPOINT,
                    "config": {
                        "served_entities": [{**ENTITY, "min_replicas": 2, "max_replicas": 2}],
                        "stream_inputs": [stream],
                    },
                },
            )
            assert created.status_code == 200, created.text
            assert created.json()["config"]["stream_inputs"][0]["source"] == stream["source"]
        wait_endpoint_ready(running[0].url, token, ENDPOINT, timeout_s=240)
        yield running
    finally:
        try:
            with _api(running[-1], token) as api:
                api.delete(f"/api/2.0/serving-endpoints/{ENDPOINT}")  # later gateways on this state must not consume it
        finally:
            running[-1].stop()


def _api(gateway: GatewayProcess, token: str) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _events(rows: pd.DataFrame, n: int, start: int) -> list[dict[str, str]]:
    picked = rows.iloc[[(start + i) % len(rows) for i in range(n)]]
    return [
        {"customer_id": str(c), "merchant_id": str(m), "amount": repr(float(a))}
        for c, m, a in zip(picked["customer_id"], picked["merchant_id"], picked["amount"])
    ]


def _append(client: redis.Redis, events: list[dict[str, str]]) -> list[str]:
    ids: list[str] = []
    for at in range(0, len(events), 5_000):
        pipe = client.pipeline(transaction=False)
        for event in events[at : at + 5_000]:
            pipe.xadd(SOURCE, event)
        ids.extend(i.decode() for i in pipe.execute())
    return ids


class _Tail:
    """A stream read on from where the last call stopped: a wait reads each entry once, not the whole stream
    (100,000 results and more) at every poll, which took a core from the gateway it waited for."""

    def __init__(self, client: redis.Redis, stream: str) -> None:
        self.client, self.stream, self.after = client, stream, "-"

    def entries(self) -> list[dict[bytes, bytes]]:
        """The fields of every entry appended since the last call (of all of them, the first time)."""
        out: list[dict[bytes, bytes]] = []
        while True:
            chunk = self.client.xrange(self.stream, self.after, "+", count=20_000)
            out.extend(fields for _, fields in chunk)
            if chunk:
                self.after = "(" + chunk[-1][0].decode()
            if len(chunk) < 20_000:
                return out

    def event_ids(self) -> list[str]:
        return [fields[b"event_id"].decode() for fields in self.entries()]


def _outputs(client: redis.Redis, stream: str) -> list[dict[bytes, bytes]]:
    return _Tail(client, stream).entries()


def _counts(client: redis.Redis, stream: str, ids: set[str]) -> collections.Counter[str]:
    return collections.Counter(i for i in _Tail(client, stream).event_ids() if i in ids)


def _wait_all(client: redis.Redis, ids: set[str], timeout_s: float) -> None:
    """Until every id in ``ids`` has an output in the sink or the dead-letter stream."""
    deadline = time.monotonic() + timeout_s
    missing, tails = set(ids), (_Tail(client, SINK), _Tail(client, DEAD))
    while True:
        for tail in tails:
            missing.difference_update(tail.event_ids())
        if not missing:
            return
        assert time.monotonic() < deadline, (
            f"{len(missing)} of {len(ids)} events without an output after {timeout_s:.0f} s"
        )
        time.sleep(0.5)


def _wait_outputs(client: redis.Redis, ids: set[str], at_least: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    tail, seen = _Tail(client, SINK), set()
    while True:
        seen.update(i for i in tail.event_ids() if i in ids)
        if len(seen) >= at_least:
            return
        assert time.monotonic() < deadline, f"fewer than {at_least} results after {timeout_s:.0f} s"
        time.sleep(0.2)


def _exactly_once(client: redis.Redis, ids: set[str], dead: set[str] = frozenset()) -> int:  # type: ignore[assignment]
    """The number of events with exactly one output; fails naming what is doubled, missing or unexpected."""
    results, letters = _counts(client, SINK, ids), _counts(client, DEAD, ids)
    doubled = [i for i, n in (results + letters).items() if n > 1]
    assert not doubled, f"{len(doubled)} events have more than one output, e.g. {doubled[:3]}"
    assert set(letters) == dead, (
        f"dead letters: {len(set(letters) - dead)} unexpected, {len(dead - set(letters))} missing"
    )
    assert set(results) == ids - dead, f"{len(ids - dead - set(results))} events have no result"
    return len(results) + len(letters)


def test_every_event_is_scored_once_and_poison_goes_to_the_dead_letter_stream(
    world, broker, gateway, rows, gateway_env, record_property
):  # type: ignore[no-untyped-def]
    client = redis.Redis(port=broker.port)
    events = _events(rows, 2_000, start=0)
    poison: dict[int, str] = {}
    for i in range(0, 2_000, 100):  # 1 %: a missing field, a wrong type, an unknown customer
        kind = (i // 100) % 3
        if kind == 0:
            del events[i]["amount"]
        elif kind == 1:
            events[i]["amount"] = "twelve-quid"
        else:
            events[i]["customer_id"] = "987654321"
        poison[i] = ("amount", "amount", "unknown entity")[kind]
    started = time.monotonic()
    ids = _append(client, events)
    _wait_all(client, set(ids), timeout_s=120)
    record_property("events_2000_s", round(time.monotonic() - started, 2))
    dead_ids = {ids[i] for i in poison}
    _exactly_once(client, set(ids), dead_ids)

    champion = (
        MlflowClient(world.settings.tracking_uri).get_model_version_by_alias(ENTITY["entity_name"], "champion").version
    )
    wanted = set(ids)
    results = [f for f in _outputs(client, SINK) if f[b"event_id"].decode() in wanted]
    assert {f[b"model_version"].decode() for f in results} == {str(champion)}
    assert {f[b"served_entity"].decode() for f in results} == {f"{ENTITY['entity_name']}-champion"}
    by_id = {f[b"event_id"].decode(): json.loads(f[b"prediction"]) for f in results}
    token = gateway_env["TOLLFREE_TOKEN"]
    with _api(gateway[-1], token) as api:  # a scored event predicts what the same row does over HTTP
        row = {
            "customer_id": int(events[1]["customer_id"]),
            "merchant_id": int(events[1]["merchant_id"]),
            "amount": float(events[1]["amount"]),
        }
        http = api.post(f"/serving-endpoints/{ENDPOINT}/invocations", json={"dataframe_records": [row]})
        assert http.status_code == 200, http.text
    assert by_id[ids[1]] == pytest.approx(http.json()["predictions"][0])
    letters = {f[b"event_id"].decode(): f for f in _outputs(client, DEAD)}
    for i, what in poison.items():
        letter = letters[ids[i]]
        reason = letter[b"reason"].decode()
        assert what in reason, reason
        assert "twelve-quid" not in reason and "987654321" not in reason
        assert letter[b"merchant_id"] == events[i]["merchant_id"].encode()  # the original fields, kept

    with _api(gateway[-1], token) as api:
        metrics = api.get("/metrics").text
    samples = {
        (m.name, m.labels.get("outcome")): m.value
        for family in text_string_to_metric_families(metrics)
        for m in family.samples
        if m.labels.get("endpoint") == ENDPOINT
    }
    assert samples[("tollfree_stream_events_total", "dead_letter")] == len(poison)
    assert samples[("tollfree_stream_events_total", "result")] == len(ids) - len(poison)
    assert ("tollfree_stream_lag_entries", None) in samples
    deadline = time.monotonic() + 30  # the inference log is flushed every second or so
    while True:
        logged = read_inference_log(world.settings.inference_log_dir)
        mine = logged[logged["request_id"].isin(ids)]
        if len(mine) == len(ids):
            break
        assert time.monotonic() < deadline, f"{len(mine)} of {len(ids)} events in the inference log"
        time.sleep(0.5)
    assert set(mine[mine["status_code"] == 200]["request_id"]) == set(ids) - dead_ids
    assert mine[mine["status_code"] == 200]["served_features"].notna().all()


def test_redis_restarted_mid_stream_loses_and_doubles_nothing(broker, gateway, rows, record_property):  # type: ignore[no-untyped-def]
    client = redis.Redis(port=broker.port)
    first = _append(client, _events(rows, 10_000, start=3_000))
    _wait_outputs(client, set(first), 2_000, timeout_s=120)
    broker.stop()  # SIGTERM: the append-only file is written out
    restarted_at = time.monotonic()
    broker.start()
    client = redis.Redis(port=broker.port)
    second = _append(client, _events(rows, 10_000, start=13_000))
    ids = set(first) | set(second)
    _wait_all(client, ids, timeout_s=240)
    record_property("resumed_and_drained_s", round(time.monotonic() - restarted_at, 2))
    assert _exactly_once(client, ids) == 20_000


def test_kill_9_of_the_gateway_mid_stream_then_a_restart_scores_every_event_exactly_once(
    world, broker, gateway, rows, gateway_env, record_property
):  # type: ignore[no-untyped-def]
    client = redis.Redis(port=broker.port)
    ids = _append(client, _events(rows, 100_000, start=30_000))
    started = time.monotonic()
    _wait_outputs(client, set(ids), 15_000, timeout_s=240)
    gateway[-1].process.send_signal(signal.SIGKILL)
    gateway[-1].process.wait(10)
    done_at_crash = len(_counts(client, SINK, set(ids)))
    assert done_at_crash < len(ids), "the stream was drained before the crash: nothing was tested"
    gateway.append(start_gateway(gateway_env, Path(world.home) / "logs" / "gateway-streams-2.log", timeout_s=240))
    wait_endpoint_ready(gateway[-1].url, gateway_env["TOLLFREE_TOKEN"], ENDPOINT, timeout_s=240)
    _wait_all(client, set(ids), timeout_s=420)
    took = time.monotonic() - started
    record_property("kill_9_100k", {"results_before_crash": done_at_crash, "seconds": round(took, 1)})
    print(f"100,000 events, gateway killed after {done_at_crash} results: all scored once in {took:.0f} s")
    _exactly_once(client, set(ids))
