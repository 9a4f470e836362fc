"""An endpoint's ``stream_inputs`` (serving.streams.config): refused with a 400 naming the field, never the value;
kept, shown and stored as given; through the real gateway's control plane too."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from serving.endpoints.spec import EndpointCoreConfig, EndpointRecord
from serving.endpoints.validation import normalize_config
from serving.endpoints.views import config_view, endpoint_view
from serving.gateway.auth import Tokens
from serving.protocol.errors import ApiError
from serving.streams.config import MAX_STREAM_INPUTS, StreamAddress, StreamInput, check_stream_inputs
from tests.fakes import in_process_gateway

SECRET = "SECRET-VALUE-123"  # a valid stream name and host label: planted in values, never in a message
ADMIN = "stream-config-admin-token-0123456789"
R = "redis://localhost:6379"


def streams(**changes: Any) -> dict[str, Any]:
    return {"source": f"{R}/in", "sink": f"{R}/out", "dead_letter": f"{R}/dead", **changes}


def config(*inputs: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {"served_entities": [{"entity_name": "m", "entity_version": "1"}]}
    if inputs != (None,):
        body["stream_inputs"] = list(inputs)
    return body


def normalized(*inputs: dict[str, Any] | None) -> EndpointCoreConfig:
    return normalize_config(EndpointCoreConfig.model_validate(config(*inputs)))


def refusal(*inputs: dict[str, Any]) -> str:
    with pytest.raises(ApiError) as refused:
        normalized(*inputs)
    assert (refused.value.status_code, refused.value.error_code) == (400, "INVALID_PARAMETER_VALUE")
    assert SECRET not in refused.value.message
    return refused.value.message


# ---- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host", "port", "stream", "canonical"),
    [
        ("redis://localhost:6379/in", "localhost", 6379, "in", "redis://localhost:6379/in"),
        (
            "redis://Redis.Example.COM:6380/a:b.c-d_e",
            "redis.example.com",
            6380,
            "a:b.c-d_e",
            "redis://redis.example.com:6380/a:b.c-d_e",
        ),
        ("redis://10.0.0.7:1/x", "10.0.0.7", 1, "x", "redis://10.0.0.7:1/x"),
        ("redis://[::1]:65535/x", "::1", 65535, "x", "redis://[::1]:65535/x"),
        ("redis://[2001:DB8:0:0::1]:6379/x", "2001:db8::1", 6379, "x", "redis://[2001:db8::1]:6379/x"),
        ("redis://redis_1:6379/" + "s" * 200, "redis_1", 6379, "s" * 200, "redis://redis_1:6379/" + "s" * 200),
    ],
)
def test_an_address_parses_to_its_server_stream_and_canonical_url(url, host, port, stream, canonical):
    address = StreamAddress.parse(url, "source")
    assert (address.host, address.port, address.stream) == (host, port, stream)
    assert address.server == (host, port) and address.url == canonical
    assert StreamAddress.parse(address.url, "source") == address


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("", "scheme"),
        (f"rediss://h:1/{SECRET}", "scheme must be redis"),
        (f"REDIS://h:1/{SECRET}", "scheme must be redis"),
        (f"http://h:1/{SECRET}", "scheme must be redis"),
        (f"{SECRET}", "scheme must be redis"),
        (f"redis://user:{SECRET}@h:1/s", "no user or password"),
        (f"redis://:{SECRET}@h:1/s", "no user or password"),
        (f"redis://h:1/s?password={SECRET}", "no query or fragment"),
        (f"redis://h:1/s#{SECRET}", "no query or fragment"),
        (f"redis://{SECRET}/s", "port is required"),
        (f"redis://[::1]/{SECRET}", "port is required"),
        (f"redis://{SECRET}:/s", "port must be 1 to 65535"),
        (f"redis://{SECRET}:0/s", "port must be 1 to 65535"),
        (f"redis://{SECRET}:65536/s", "port must be 1 to 65535"),
        (f"redis://{SECRET}:+80/s", "port must be 1 to 65535"),
        (f"redis://:6379/{SECRET}", "host must be"),
        (f"redis://bad!{SECRET}:6379/s", "host must be"),
        (f"redis://-{SECRET}:6379/s", "host must be"),
        (f"redis://{SECRET}..x:6379/s", "host must be"),
        (f"redis://999.1.1.1:6379/{SECRET}", "host must be"),
        (f"redis://[zz]:6379/{SECRET}", "host must be"),
        (f"redis://[fe80::1%eth0]:6379/{SECRET}", "host must be"),
        (f"redis://::1:6379/{SECRET}", "host must be"),
        (f"redis://{SECRET}:6379", "the path must be one segment"),
        (f"redis://{SECRET}:6379/", "the path must be one segment"),
        (f"redis://{SECRET}:6379/a/b", "the path must be one segment"),
        (f"redis://{SECRET}:6379/a%2Fb", "the path must be one segment"),
        (f"redis://{SECRET}:6379/" + "s" * 201, "the path must be one segment"),
        (f"redis://{SECRET}:6379/a b", "printable ASCII characters without spaces"),
        (f"redis://{SECRET}:6379/a\nb", "printable ASCII characters without spaces"),
        (f"redis://{SECRET}:6379/é", "printable ASCII characters without spaces"),
    ],
)
def test_anything_but_redis_host_port_stream_is_refused_naming_the_field(url, reason):
    with pytest.raises(ApiError) as refused:
        StreamAddress.parse(url, "stream_inputs[3].sink")
    message = refused.value.message
    assert refused.value.status_code == 400 and refused.value.error_code == "INVALID_PARAMETER_VALUE"
    assert message.startswith("stream_inputs[3].sink must be redis://HOST:PORT/STREAM (") and reason in message
    assert SECRET not in message


# ---- the model ---------------------------------------------------------------------------------


def test_defaults_and_addresses():
    s = StreamInput.model_validate(streams())
    assert (s.group, s.batch_size, s.max_wait_ms, s.max_lag_s) == ("tollfree", 100, 10, 30.0)
    assert s.source_address == StreamAddress("localhost", 6379, "in")
    assert s.sink_address.stream == "out" and s.dead_letter_address.stream == "dead"
    assert s.sink_address.server == s.dead_letter_address.server == ("localhost", 6379)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1025}, "batch_size"),
        ({"batch_size": "10"}, "batch_size"),
        ({"batch_size": 1.5}, "batch_size"),
        ({"batch_size": True}, "batch_size"),
        ({"max_wait_ms": -1}, "max_wait_ms"),
        ({"max_wait_ms": 10_001}, "max_wait_ms"),
        ({"max_lag_s": 0}, "max_lag_s"),
        ({"max_lag_s": -1.0}, "max_lag_s"),
        ({"max_lag_s": 86_401}, "max_lag_s"),
        ({"max_lag_s": "soon"}, "max_lag_s"),
        ({"group": f"bad group {SECRET}"}, "group"),
        ({"group": ""}, "group"),
        ({"group": "g" * 101}, "group"),
        ({"source": f"{R}/" + SECRET * 20}, "source"),
        ({"sink": 7}, "sink"),
        ({"dead_letter": ...}, "dead_letter"),
        ({"topic": SECRET}, "topic"),
    ],
)
def test_a_bad_field_is_a_400_naming_it_in_the_gateway_and_never_echoing_it(gateway, changes, field):
    inputs = {k: v for k, v in streams(**changes).items() if v is not ...}
    created = gateway.post("/api/2.0/serving-endpoints", json={"name": "bad", "config": config(streams(), inputs)})
    assert created.status_code == 400 and created.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert f"config.stream_inputs[1].{field}" in created.json()["message"]
    assert SECRET not in created.text
    updated = gateway.put("/api/2.0/serving-endpoints/bad/config", json=config(inputs))
    assert updated.status_code == 400 and updated.json()["message"].startswith(f"stream_inputs[0].{field}")
    assert SECRET not in updated.text


def test_the_extremes_of_every_range_are_accepted():
    for values in (
        {"batch_size": 1, "max_wait_ms": 0, "max_lag_s": 0.001, "group": "a"},
        {"batch_size": 1024, "max_wait_ms": 10_000, "max_lag_s": 86_400, "group": "G:1.x-y_z" * 10},
    ):
        s = normalized(streams(**values)).stream_inputs[0]
        assert {k: getattr(s, k) for k in values} == values


# ---- the checks across fields and inputs -------------------------------------------------------


def test_at_most_eight_inputs():
    inputs = [streams(source=f"{R}/in{i}") for i in range(MAX_STREAM_INPUTS)]
    assert len(normalized(*inputs).stream_inputs) == MAX_STREAM_INPUTS
    message = refusal(*inputs, streams(source=f"{R}/in{MAX_STREAM_INPUTS}"))
    assert message == f"stream_inputs lists at most {MAX_STREAM_INPUTS} inputs"


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (
            [streams(), streams(source=f"redis://{SECRET}/in")],
            "stream_inputs[1].source must be redis://HOST:PORT/STREAM",
        ),
        ([streams(sink=f"redis://h:1/a/{SECRET}")], "stream_inputs[0].sink must be redis://HOST:PORT/STREAM"),
        ([streams(dead_letter=f"redis://:{SECRET}@h:1/d")], "stream_inputs[0].dead_letter must be redis://"),
        (
            [streams(source=f"{R}/{SECRET}", sink=f"{R}/{SECRET}")],
            "stream_inputs[0].sink is the same stream as stream_inputs[0].source",
        ),
        (
            [streams(source=f"redis://LocalHost:6379/{SECRET}", dead_letter=f"{R}/{SECRET}")],
            "stream_inputs[0].dead_letter is the same stream as stream_inputs[0].source",
        ),
        (
            [streams(sink=f"{R}/{SECRET}", dead_letter=f"{R}/{SECRET}")],
            "stream_inputs[0].dead_letter is the same stream as stream_inputs[0].sink",
        ),
        (
            [streams(dead_letter=f"redis://{SECRET}:6379/dead")],
            "stream_inputs[0].dead_letter must be on the same Redis server (host:port) as stream_inputs[0].sink: "
            "the consumer writes both in one atomic script",
        ),
        ([streams(dead_letter="redis://localhost:6380/dead")], "one atomic script"),
        (
            [streams(source=f"{R}/{SECRET}"), streams(source=f"{R}/{SECRET}", sink=f"{R}/o2", dead_letter=f"{R}/d2")],
            "stream_inputs[1] reads the same source with the same group as stream_inputs[0]",
        ),
        (
            [
                streams(),
                streams(source="redis://127.0.0.1:6379/x"),
                streams(source="redis://LOCALHOST:6379/in", group="tollfree"),
            ],
            "stream_inputs[2] reads the same source with the same group as stream_inputs[0]",
        ),
        (
            [streams(source=f"{R}/{SECRET}"), streams(source=f"{R}/b", sink=f"{R}/{SECRET}")],
            "stream_inputs[1].sink is the stream stream_inputs[0].source reads: the endpoint would read its own output",
        ),
        (
            [
                streams(dead_letter=f"{R}/{SECRET}"),
                streams(source=f"{R}/{SECRET}", sink=f"{R}/o2", dead_letter=f"{R}/d2"),
            ],
            "stream_inputs[0].dead_letter is the stream stream_inputs[1].source reads",
        ),
    ],
)
def test_what_the_types_cannot_say_is_refused_naming_fields_and_indexes(inputs, expected):
    assert expected in refusal(*inputs)


def test_the_same_source_with_another_group_and_a_shared_sink_are_fine():
    inputs = [streams(), streams(group="audit"), streams(source=f"{R}/other")]
    check_stream_inputs([StreamInput.model_validate(s) for s in inputs])
    assert [s.group for s in normalized(*inputs).stream_inputs] == ["tollfree", "audit", "tollfree"]


def test_check_stream_inputs_refuses_by_itself_too():
    with pytest.raises(ApiError, match=r"stream_inputs\[0\]\.sink is the same stream"):
        check_stream_inputs([StreamInput(source=f"{R}/a", sink=f"{R}/a", dead_letter=f"{R}/d")])
    check_stream_inputs([])


# ---- kept, shown, stored -----------------------------------------------------------------------


def test_the_view_shows_them_with_their_defaults_and_only_when_set():
    view = config_view(normalized(streams(group="g", batch_size=8)), 1, {})
    assert view["stream_inputs"] == [
        {
            "source": f"{R}/in",
            "sink": f"{R}/out",
            "dead_letter": f"{R}/dead",
            "group": "g",
            "batch_size": 8,
            "max_wait_ms": 10,
            "max_lag_s": 30.0,
        }
    ]
    assert "stream_inputs" not in config_view(normalized(None), 1, {})
    empty = normalized()  # "stream_inputs": [] is none
    assert empty.stream_inputs is None and "stream_inputs" not in config_view(empty, 1, {})


def test_normalize_is_idempotent_with_them():
    once = normalized(streams(), streams(source=f"{R}/b", sink=f"{R}/o2", dead_letter=f"{R}/d2", max_lag_s=5))
    assert normalize_config(once) == once and normalize_config(normalize_config(once)) == once
    assert once.stream_inputs is not None and [s.source for s in once.stream_inputs] == [f"{R}/in", f"{R}/b"]


def test_the_record_json_round_trip_keeps_them():
    current, pending = normalized(streams()), normalized(streams(batch_size=7), streams(source=f"{R}/b"))
    record = EndpointRecord(
        name="ep",
        id="0" * 32,
        creator="alice",
        created_ms=1,
        updated_ms=2,
        config=current,
        pending_config=pending,
        ready="READY",
        config_update="IN_PROGRESS",
        revision=3,
    )
    text = record.to_json()
    assert json.loads(text)["config"]["stream_inputs"][0]["source"] == f"{R}/in"
    restored = EndpointRecord.from_json(text, revision=3)
    assert restored == record
    assert restored.pending_config is not None and restored.pending_config.stream_inputs[0].batch_size == 7
    assert endpoint_view(restored)["pending_config"]["stream_inputs"][1]["source"] == f"{R}/b"


# ---- through the real gateway's control plane --------------------------------------------------


@pytest.fixture
def gateway(tmp_path):  # type: ignore[no-untyped-def]
    """The real gateway app (no lifespan: nothing starts) as a follower: a create or an update is stored,
    and no replica is started."""
    app = in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN}))
    app.state.manager.leading = False
    yield TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"})
    app.state.manager.live.clear()


def _settled(client: TestClient, name: str) -> None:
    """What the leader's rollout would do: the pending config becomes the current one."""
    store = client.app.state.manager.store  # type: ignore[attr-defined]
    record = store.get(name)
    if record.pending_config is not None:
        record.config, record.pending_config = record.pending_config, None
        record.config_version += 1
    record.ready, record.config_update = "READY", "NOT_UPDATING"
    store.put(record)


def test_the_gateway_creates_an_endpoint_with_stream_inputs_and_shows_them(gateway):
    created = gateway.post(
        "/api/2.0/serving-endpoints", json={"name": "streamy", "config": config(streams(batch_size=5))}
    )
    assert created.status_code == 200, created.text
    got = gateway.get("/api/2.0/serving-endpoints/streamy").json()["config"]["stream_inputs"]
    assert got == [{**streams(), "group": "tollfree", "batch_size": 5, "max_wait_ms": 10, "max_lag_s": 30.0}]
    assert gateway.app.state.manager.store.get("streamy").config.stream_inputs[0].batch_size == 5


def test_a_gateway_config_update_replaces_keeps_or_removes_them(gateway):
    assert (
        gateway.post("/api/2.0/serving-endpoints", json={"name": "streamy", "config": config(streams())}).status_code
        == 200
    )
    _settled(gateway, "streamy")
    put = gateway.put("/api/2.0/serving-endpoints/streamy/config", json=config(streams(group="g2")))
    assert put.status_code == 200, put.text
    assert put.json()["pending_config"]["stream_inputs"][0]["group"] == "g2"
    _settled(gateway, "streamy")
    kept = gateway.put("/api/2.0/serving-endpoints/streamy/config", json=config(None))  # what the Databricks SDK sends
    assert kept.status_code == 200 and kept.json()["pending_config"]["stream_inputs"][0]["group"] == "g2"
    _settled(gateway, "streamy")
    removed = gateway.put("/api/2.0/serving-endpoints/streamy/config", json=config())
    assert removed.status_code == 200 and "stream_inputs" not in removed.json()["pending_config"]


def test_the_gateway_refuses_a_bad_stream_input_naming_it(gateway):
    bad = streams(sink=f"{R}/{SECRET}", source=f"{R}/{SECRET}")
    reply = gateway.post("/api/2.0/serving-endpoints", json={"name": "streamy", "config": config(bad)})
    assert reply.status_code == 400 and reply.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert reply.json()["message"].startswith("stream_inputs[0].sink ") and SECRET not in reply.text
    assert gateway.get("/api/2.0/serving-endpoints/streamy").status_code == 404
