"""The ``tollfree`` deployments target's ``-C`` config without a live gateway: ``stream_inputs`` parsed from
JSON or given as a list, sent on create and update (kept when left out), and shown by get/list; once
against the real gateway app in-process (tests/e2e/test_mlflow_plugin.py runs the plugin against a live one)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from mlflow.exceptions import MlflowException

from serving import mlflow_plugin
from serving.gateway.auth import Tokens
from serving.mlflow_plugin import DeploymentConfig, TollfreeDeploymentClient, parse_config
from tests.fakes import in_process_gateway

SECRET = "SECRET-VALUE-123"
TOKEN = "plugin-config-admin-token-0123456789"
R = "redis://localhost:6379"
INPUT = {"source": f"{R}/in", "sink": f"{R}/out", "dead_letter": f"{R}/dead"}
SHOWN = {**INPUT, "group": "tollfree", "batch_size": 100, "max_wait_ms": 10, "max_lag_s": 30.0}


def test_stream_inputs_come_as_a_json_string_or_a_python_list():
    assert parse_config({"stream_inputs": json.dumps([INPUT]), "min_replicas": "1"}) == DeploymentConfig(
        {"min_replicas": 1}, True, 300.0, [INPUT]
    )
    assert parse_config({"stream_inputs": [INPUT], "await_ready": "false"}).stream_inputs == [INPUT]
    assert parse_config({"stream_inputs": (INPUT,)}).stream_inputs == [INPUT]
    for none in ("[]", " null ", [], None):
        assert parse_config({"stream_inputs": none}).stream_inputs == []
    assert parse_config(None) == DeploymentConfig({}, True, 300.0, None)
    assert parse_config({"max_replicas": "3", "timeout_s": "5"}) == DeploymentConfig(
        {"max_replicas": 3}, True, 5.0, None
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"[{{'source': '{SECRET}'}}]", "config stream_inputs is not valid JSON (line 1, column 3)"),
        (f'[{{"source": "{SECRET}"', "config stream_inputs is not valid JSON"),
        (f"{SECRET}", "config stream_inputs is not valid JSON"),
        (b"\xff", "config stream_inputs is not valid JSON"),
        (json.dumps({"source": SECRET}), "config stream_inputs must be a list of objects"),
        (json.dumps([SECRET]), "config stream_inputs must be a list of objects"),
        ({"source": SECRET}, "config stream_inputs must be a list of objects"),
        (7, "config stream_inputs must be a list of objects"),
    ],
)
def test_a_bad_stream_inputs_value_is_a_clear_error_naming_it(value, expected):
    with pytest.raises(MlflowException) as refused:
        parse_config({"stream_inputs": value})
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE"
    assert expected in refused.value.message and SECRET not in refused.value.message


def test_the_unknown_key_message_lists_stream_inputs():
    with pytest.raises(MlflowException, match="stream_inputs"):
        parse_config({"streams": "[]"})


class Recorder(TollfreeDeploymentClient):
    """The client with its gateway calls recorded; GET answers ``current``, a change answers it too."""

    def __init__(self, current: dict[str, Any]) -> None:
        self.url, self._token, self.current, self.calls = "http://gw", "t", current, []

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        self.calls.append((method, path, body))
        return self.current


def view(stream_inputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    entity = {"name": "m-1", "entity_name": "m", "entity_version": "1", "min_replicas": 2, "state": {}}
    config: dict[str, Any] = {
        "served_entities": [entity],
        "config_version": 1,
        "traffic_config": {"routes": [{"served_entity_name": "m-1", "traffic_percentage": 100}]},
    }
    if stream_inputs is not None:
        config["stream_inputs"] = stream_inputs
    return {"name": "ep", "state": {"ready": "READY", "config_update": "NOT_UPDATING"}, "config": config}


def test_create_sends_them_on_the_config():
    client = Recorder(view([SHOWN]))
    shown = client.create_deployment(
        "ep", "models:/m/1", config={"stream_inputs": json.dumps([INPUT]), "await_ready": "false"}
    )
    assert client.calls == [
        (
            "POST",
            "/api/2.0/serving-endpoints",
            {
                "name": "ep",
                "config": {"served_entities": [{"entity_name": "m", "entity_version": "1"}], "stream_inputs": [INPUT]},
            },
        )
    ]
    assert shown["stream_inputs"] == [SHOWN]
    client.create_deployment("ep2", "models:/m/1", config={"await_ready": "false"})
    assert "stream_inputs" not in client.calls[-1][2]["config"]


@pytest.mark.parametrize("model_uri", [None, "models:/m/2"])
def test_an_update_keeps_them_unless_given(model_uri):
    client = Recorder(view([SHOWN]))
    client.update_deployment("ep", model_uri, config={"await_ready": "false"})
    put = client.calls[-1]
    assert put[:2] == ("PUT", "/api/2.0/serving-endpoints/ep/config") and put[2]["stream_inputs"] == [SHOWN]
    assert put[2]["served_entities"][0]["min_replicas"] == 2
    other = {**INPUT, "group": "g2"}
    client.update_deployment("ep", model_uri, config={"await_ready": "false", "stream_inputs": [other]})
    assert client.calls[-1][2]["stream_inputs"] == [other]
    client.update_deployment("ep", model_uri, config={"await_ready": "false", "stream_inputs": "[]"})
    assert client.calls[-1][2]["stream_inputs"] == []  # sent, so the gateway removes them
    plain = Recorder(view())
    plain.update_deployment("ep", model_uri, config={"await_ready": "false"})
    assert "stream_inputs" not in plain.calls[-1][2]


def test_get_and_list_show_them_only_when_the_endpoint_has_them():
    assert Recorder(view([SHOWN])).get_deployment("ep")["stream_inputs"] == [SHOWN]
    assert "stream_inputs" not in Recorder(view()).get_deployment("ep")
    listing = Recorder({"endpoints": [view([SHOWN]), view()]}).list_deployments()
    assert [d.get("stream_inputs") for d in listing] == [[SHOWN], None]


def test_against_the_real_gateway_app(tmp_path, monkeypatch):
    """Create with -C stream_inputs, read them back; a bad one is the gateway's 400, naming the field."""
    app = in_process_gateway(tmp_path, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}))
    app.state.manager.leading = False  # stored, no replica started
    http = TestClient(app)
    monkeypatch.setattr(httpx, "request", lambda method, url, timeout=None, **kw: http.request(method, url, **kw))
    monkeypatch.setenv(mlflow_plugin.TOKEN_ENV, TOKEN)
    client = TollfreeDeploymentClient("tollfree:/http://testserver")
    created = client.create_deployment(
        "streamy", "models:/m/1", config={"stream_inputs": json.dumps([INPUT]), "await_ready": "false"}
    )
    assert created["stream_inputs"] == [SHOWN] and client.get_deployment("streamy")["stream_inputs"] == [SHOWN]
    bad = json.dumps([{**INPUT, "sink": f"{R}/{SECRET}", "dead_letter": f"{R}/{SECRET}"}])
    with pytest.raises(MlflowException) as refused:
        client.create_deployment("bad", "models:/m/1", config={"stream_inputs": bad, "await_ready": "false"})
    assert refused.value.error_code == "INVALID_PARAMETER_VALUE" and SECRET not in refused.value.message
    assert "stream_inputs[0].dead_letter is the same stream as stream_inputs[0].sink" in refused.value.message
    app.state.manager.live.clear()
