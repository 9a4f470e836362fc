"""Generative endpoints end to end: a real gateway process, replicas of a real MLflow chat model (the ticker,
``benchmarks/ticker_chat.py``: a word a chunk every 20 ms) and external models whose upstream is another
endpoint's OpenAI-compatible route on the same gateway (a real HTTP server speaking OpenAI's protocol), or a
closed port.

Holds:
- the official ``openai`` client (streaming and not), the Databricks SDK's ``serving_endpoints.query`` with
  ``messages``, and ``curl -N`` work against a chat endpoint and an external-model endpoint;
- bad requests are 400s naming the field, never echoing the value;
- a token budget refuses with 429 and Retry-After before the model is asked, and a request larger than the
  whole budget with 400;
- an external model that cannot be reached (or answers 5xx) is served by the fallback entity; with no
  fallback the client gets 502 naming the served entity and the upstream's status, never the key;
- a client that disconnects mid-stream stops the generation on the replica; a replica killed mid-stream
  ends the client's stream with an error event, not a hang;
- usage is in the inference log and the metrics; the log's payloads are redacted when the endpoint says so,
  and the input guardrail blocks personal data.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from serving.gateway.process import GatewayProcess, environ_with, start_gateway, wait_endpoint_ready
from serving.inference_log import read_inference_log
from serving.replicas.local import free_port
from tests.gateways import own_state

pytestmark = pytest.mark.slow

KEY_SECRET = "upstream/key"
TIMEOUT_S = 4  # the gateway's request timeout: how long an upstream may stay silent
CARD = "4111 1111 1111 1111"


def _entity(version: str, **extra: object) -> dict:
    return {"entity_name": "ticker", "entity_version": version, "max_concurrency": 256, **extra}


def _external(name: str, base: str) -> dict:
    return {
        "name": name,
        "external_model": {
            "name": "chat",
            "provider": "openai",
            "task": "llm/v1/chat",
            "openai_config": {"openai_api_key": "{{secrets/" + KEY_SECRET + "}}", "openai_api_base": base},
        },
    }


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ticker") / "trace.txt"


@pytest.fixture(scope="module")
def chat_gateway(session_home: Path, trace: Path) -> Iterator[GatewayProcess]:
    from benchmarks.ticker_chat import log_ticker

    first = log_ticker("ticker", interval_s=0.02, trace=str(trace))
    killable = log_ticker("ticker", interval_s=0.02)
    token = os.environ["TOLLFREE_TOKEN"]
    secret = session_home / "secrets" / KEY_SECRET
    secret.parent.mkdir(parents=True, exist_ok=True)
    secret.write_text(token)  # the upstream is this gateway: its key is the admin token
    env = environ_with(
        {
            "TOLLFREE_WARM_POOL": "0",
            "TOLLFREE_REQUEST_TIMEOUT_S": str(TIMEOUT_S),
            **own_state(session_home / "generative"),
        }
    )
    gateway = start_gateway(env, session_home / "logs" / "gateway-generative.log", timeout_s=240)
    closed = f"http://127.0.0.1:{free_port()}/v1"
    silent = socket.create_server(("127.0.0.1", 0))  # takes connections, never answers
    quiet = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"
    own = f"{gateway.url}/serving-endpoints"
    endpoints = {
        "chat": {"served_entities": [_entity(first)], "response_cache": {"enabled": True}},
        "silent": {"served_entities": [_external("quiet", quiet)]},
        "killable": {"served_entities": [_entity(killable)]},
        "ext": {"served_entities": [_external("upstream", own)]},
        "noback": {"served_entities": [_external("gone", closed)]},
        "fallback": {
            "served_entities": [_external("gone", closed), {**_entity(first), "name": "local"}],
            "traffic_config": {
                "routes": [
                    {"served_entity_name": "gone", "traffic_percentage": 100},
                    {"served_entity_name": "local", "traffic_percentage": 0},
                ]
            },
        },
    }
    try:
        with _api(gateway) as api:
            for name, config in endpoints.items():
                created = api.post("/api/2.0/serving-endpoints", json={"name": name, "config": config})
                assert created.status_code == 200, created.text
            on = api.put("/api/2.0/serving-endpoints/fallback/ai-gateway", json={"fallback_config": {"enabled": True}})
            assert on.status_code == 200, on.text
        for name in endpoints:
            wait_endpoint_ready(gateway.url, token, name, timeout_s=240)
        yield gateway
    finally:
        gateway.stop()
        silent.close()


def _api(gateway: GatewayProcess, token: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=gateway.url, headers={"Authorization": f"Bearer {token or os.environ['TOLLFREE_TOKEN']}"}, timeout=60
    )


def _openai(gateway: GatewayProcess):  # type: ignore[no-untyped-def]
    from openai import OpenAI

    return OpenAI(base_url=f"{gateway.url}/serving-endpoints", api_key=os.environ["TOLLFREE_TOKEN"], max_retries=0)


@pytest.mark.parametrize("endpoint", ["chat", "ext"])
def test_the_openai_client_gets_whole_and_streamed_answers(chat_gateway: GatewayProcess, endpoint: str) -> None:
    client = _openai(chat_gateway)
    whole = client.chat.completions.create(
        model=endpoint, messages=[{"role": "user", "content": "red green"}], max_tokens=3
    )
    assert whole.choices[0].message.content == "red green red"
    assert whole.usage is not None and whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0

    chunks = list(
        client.chat.completions.create(
            model=endpoint,
            messages=[{"role": "user", "content": "one two"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "one two one two one"
    assert sum(1 for c in chunks if c.choices) == 5, "one chunk a token group, as the model yields them"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 5

    plain = list(
        client.chat.completions.create(
            model=endpoint, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True
        )
    )
    assert all(c.usage is None for c in plain), "the usage chunk only when asked for"


@pytest.mark.parametrize("endpoint", ["chat", "ext"])
def test_the_databricks_sdk_queries_with_messages(chat_gateway: GatewayProcess, endpoint: str) -> None:
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.service.serving import ChatMessage, ChatMessageRole

    workspace = WorkspaceClient(host=chat_gateway.url, token=os.environ["TOLLFREE_TOKEN"], auth_type="pat")
    answer = workspace.serving_endpoints.query(
        endpoint, messages=[ChatMessage(role=ChatMessageRole.USER, content="sky")], max_tokens=2
    )
    assert answer.choices[0].message.content == "sky sky"
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


@pytest.mark.parametrize("endpoint", ["chat", "ext"])
def test_curl_streams_server_sent_events_as_they_come(chat_gateway: GatewayProcess, endpoint: str) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "tick"}], "max_tokens": 4, "stream": True})
    out = subprocess.run(
        [
            "curl",
            "-sN",
            "--max-time",
            "30",
            "-H",
            f"Authorization: Bearer {os.environ['TOLLFREE_TOKEN']}",
            "-H",
            "content-type: application/json",
            "-d",
            body,
            f"{chat_gateway.url}/serving-endpoints/{endpoint}/invocations",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    events = [line.removeprefix("data: ") for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:-1]] == ["tick", " tick", " tick", " tick"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "wizard", "content": "SECRET-ROLE-VALUE"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}, "max_tokens"),
        ({"messages": "SECRET-NOT-A-LIST"}, "messages must be a list"),
        ({"messages": [{"role": "user", "content": 7}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": 9}, "temperature"),
        ({"max_tokens": 16}, "messages is required"),  # no chat request at all: to a replica, as a tabular body goes
        ({"dataframe_split": {"columns": ["SECRET"], "data": [[1]]}}, "messages is required"),
    ],
)
def test_bad_chat_requests_are_400_naming_the_field(chat_gateway: GatewayProcess, body: dict, field: str) -> None:
    with _api(chat_gateway) as api:
        answer = api.post("/serving-endpoints/chat/invocations", json=body)
        external = api.post("/serving-endpoints/ext/invocations", json=body)
        openai_route = api.post("/serving-endpoints/chat/completions", json={**body, "model": "chat"})
    for response in (answer, external, openai_route):
        assert response.status_code == 400, response.text
        assert field in response.json()["message"]
        assert "SECRET" not in response.text and "1000000000" not in response.text


def test_the_openai_route_needs_a_model_the_token_may_use(chat_gateway: GatewayProcess) -> None:
    with _api(chat_gateway) as api:
        missing = api.post("/serving-endpoints/chat/completions", json={"messages": [{"role": "user", "content": "a"}]})
        unknown = api.post(
            "/serving-endpoints/chat/completions",
            json={"model": "nope", "messages": [{"role": "user", "content": "a"}]},
        )
    with _api(chat_gateway, "not-a-token") as api:
        anonymous = api.post(
            "/serving-endpoints/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "a"}]},
        )
    assert missing.status_code == 400 and "model" in missing.json()["message"]
    assert unknown.status_code == 404
    assert anonymous.status_code == 401


def test_a_token_budget_refuses_before_the_model_is_asked(chat_gateway: GatewayProcess) -> None:
    with _api(chat_gateway) as api:
        limits = api.put(
            "/api/2.0/serving-endpoints/killable/ai-gateway",
            json={"rate_limits": [{"key": "endpoint", "tokens": 200, "renewal_period": "minute"}]},
        )
        assert limits.status_code == 200, limits.text
        try:
            ask = {"messages": [{"role": "user", "content": "a"}], "max_tokens": 50}
            first = api.post("/serving-endpoints/killable/invocations", json=ask)
            second = api.post("/serving-endpoints/killable/invocations", json={**ask, "max_tokens": 190})
            too_big = api.post("/serving-endpoints/killable/invocations", json={**ask, "max_tokens": 250})
        finally:
            api.put("/api/2.0/serving-endpoints/killable/ai-gateway", json={})
    assert first.status_code == 200, first.text
    # the first reserved 8 + 50 tokens, used 8 + 25 ("a a a ...": 99 bytes) and got the rest back; a second that
    # may use 8 + 190 does not fit in what is left of 200 a minute (about 167, refilling 3.3 a second)
    assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
    assert too_big.status_code == 400 and "max_tokens" in too_big.json()["message"]


def test_a_failing_external_model_falls_back_and_without_fallback_is_a_502(chat_gateway: GatewayProcess) -> None:
    with _api(chat_gateway) as api:
        served = api.post(
            "/serving-endpoints/fallback/invocations",
            json={"messages": [{"role": "user", "content": "b"}], "max_tokens": 2},
        )
        failed = api.post(
            "/serving-endpoints/noback/invocations", json={"messages": [{"role": "user", "content": "b"}]}
        )
        metrics = api.get("/metrics").text
    assert served.status_code == 200 and served.headers["served-model-name"] == "local"
    assert served.json()["choices"][0]["message"]["content"] == "b b"
    assert 'tollfree_fallbacks_total{endpoint="fallback",served_entity="gone"}' in metrics
    assert failed.status_code == 502, failed.text
    assert "served entity gone" in failed.json()["message"] and "could not be reached" in failed.json()["message"]
    assert os.environ["TOLLFREE_TOKEN"] not in failed.text


def test_an_upstream_5xx_is_a_502_naming_its_status(chat_gateway: GatewayProcess) -> None:
    with _api(chat_gateway) as api:
        failed = api.post(
            "/serving-endpoints/ext/invocations", json={"messages": [{"role": "user", "content": "fail"}]}
        )
    # the upstream is this gateway's chat endpoint, whose replica failed (500): it answers 502 naming its entity,
    # and the external entity's answer names the status its upstream gave
    assert failed.status_code == 502, failed.text
    assert failed.json()["message"] == "served entity upstream: the upstream answered HTTP 502"
    assert os.environ["TOLLFREE_TOKEN"] not in failed.text


def test_an_upstream_that_stays_silent_is_a_504(chat_gateway: GatewayProcess) -> None:
    started = time.monotonic()
    with _api(chat_gateway) as api:
        failed = api.post(
            "/serving-endpoints/silent/invocations", json={"messages": [{"role": "user", "content": "b"}]}
        )
    assert failed.status_code == 504, failed.text
    assert failed.json()["message"] == f"served entity quiet: the upstream did not answer within {TIMEOUT_S}s"
    assert time.monotonic() - started >= TIMEOUT_S - 0.5


def test_a_temperature_zero_answer_comes_from_the_cache_the_second_time(chat_gateway: GatewayProcess) -> None:
    ask = {"messages": [{"role": "user", "content": "cache me"}], "max_tokens": 3, "temperature": 0}
    with _api(chat_gateway) as api:
        first = api.post("/serving-endpoints/chat/invocations", json=ask)
        second = api.post("/serving-endpoints/chat/invocations", json=ask)
        warm = api.post("/serving-endpoints/chat/invocations", json={**ask, "temperature": 0.5})
    assert first.status_code == second.status_code == warm.status_code == 200
    assert "x-tollfree-cache" not in first.headers and second.headers["x-tollfree-cache"] == "hit"
    assert second.json()["choices"] == first.json()["choices"]
    assert "x-tollfree-cache" not in warm.headers


@pytest.mark.parametrize("endpoint", ["chat", "ext"])
def test_a_client_that_leaves_mid_stream_stops_the_generation(
    chat_gateway: GatewayProcess, trace: Path, endpoint: str
) -> None:
    before = trace.read_text().splitlines() if trace.exists() else []
    body = {"messages": [{"role": "user", "content": "slow"}], "max_tokens": 20, "stream": True}
    with (
        _api(chat_gateway) as api,
        api.stream("POST", f"/serving-endpoints/{endpoint}/invocations", json=body) as response,
    ):
        for line in response.iter_lines():
            if line.startswith("data: "):  # the first token (a slow token comes a second)
                with _api(chat_gateway) as other:
                    holding = other.get("/metrics").text
                break  # and leave
        # the stream holds its slot: the gateway counts it in flight (the autoscaler's load signal)
        assert f'tollfree_streams_in_flight{{endpoint="{endpoint}",' in holding
        lines = [
            line
            for line in holding.splitlines()
            if line.startswith(f'tollfree_streams_in_flight{{endpoint="{endpoint}",')
        ]
        assert any(line.endswith(" 1.0") for line in lines), lines
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        lines = trace.read_text().splitlines() if trace.exists() else []
        if len(lines) > len(before):
            break
        time.sleep(0.1)
    ended = lines[len(before) :]
    assert ended and ended[0].startswith("closed "), ended
    assert int(ended[0].split()[1]) < 20, "the generation stopped before its end"


def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error_event(chat_gateway: GatewayProcess) -> None:
    body = {"messages": [{"role": "user", "content": "slow"}], "max_tokens": 20, "stream": True}
    events = []
    with (
        _api(chat_gateway) as api,
        api.stream("POST", "/serving-endpoints/killable/invocations", json=body) as response,
    ):
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line.removeprefix("data: "))
            if len(events) == 1:
                _replica_of(chat_gateway, "killable").send_signal(signal.SIGKILL)
    assert events[-1] != "[DONE]"
    error = json.loads(events[-1])["error"]
    assert error["error_code"] == "TEMPORARILY_UNAVAILABLE" and "broke off" in error["message"]


def test_usage_is_logged_redacted_and_the_guardrail_blocks(chat_gateway: GatewayProcess, session_home: Path) -> None:
    with _api(chat_gateway) as api:
        put = api.put(
            "/api/2.0/serving-endpoints/ext/ai-gateway",
            json={"inference_table_config": {"enabled": True, "redact": ["card_number", "email"]}},
        )
        assert put.status_code == 200, put.text
        sent = api.post(
            "/serving-endpoints/ext/invocations",
            headers={"x-request-id": "redact-me-1"},
            json={"messages": [{"role": "user", "content": f"card {CARD} mail me@example.com"}], "max_tokens": 4},
        )
        blocked_on = api.put(
            "/api/2.0/serving-endpoints/ext/ai-gateway", json={"guardrails": {"input": {"pii": {"behavior": "BLOCK"}}}}
        )
        blocked = api.post(
            "/serving-endpoints/ext/invocations", json={"messages": [{"role": "user", "content": f"pay {CARD}"}]}
        )
        api.put("/api/2.0/serving-endpoints/ext/ai-gateway", json={})
        metrics = api.get("/metrics").text
    assert sent.status_code == 200 and blocked_on.status_code == 200
    assert blocked.status_code == 400 and "card_number" in blocked.json()["message"] and "4111" not in blocked.text
    record = _logged(session_home, "ext", "redact-me-1")
    assert "[REDACTED:card_number]" in record["inputs"] and "4111" not in record["inputs"]
    assert "me@example.com" not in record["inputs"] and "me@example.com" not in record["outputs"]
    assert record["input_tokens"] > 0 and record["output_tokens"] > 0
    assert 'tollfree_tokens_total{direction="output",endpoint="ext",served_entity="upstream"}' in metrics
    assert 'tollfree_time_to_first_token_seconds_count{endpoint="chat",served_entity="ticker-' in metrics


def _logged(home: Path, endpoint: str, request_id: str) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        frame = read_inference_log(home / "inference_log", endpoint=endpoint)
        found = frame[frame["request_id"] == request_id]
        if len(found):
            return found.iloc[0].to_dict()
        time.sleep(0.2)
    raise AssertionError(f"request {request_id} not in the inference log after 30 s")


def _replica_of(gateway: GatewayProcess, endpoint: str) -> psutil.Process:
    with _api(gateway) as api:
        version = api.get(f"/api/2.0/serving-endpoints/{endpoint}").json()["config"]["served_entities"][0][
            "entity_version"
        ]
    for child in psutil.Process(gateway.process.pid).children(recursive=True):
        if f"models:/ticker/{version}" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no replica of {endpoint}")


def test_the_mlflow_deployments_plugin_predicts_and_streams_chat(chat_gateway: GatewayProcess) -> None:
    from mlflow.deployments import get_deploy_client

    client = get_deploy_client(f"tollfree:/{chat_gateway.url}")
    whole = client.predict(endpoint="chat", inputs={"messages": [{"role": "user", "content": "up"}], "max_tokens": 2})
    assert whole["choices"][0]["message"]["content"] == "up up"
    chunks = list(
        client.predict_stream(
            endpoint="chat", inputs={"messages": [{"role": "user", "content": "go"}], "max_tokens": 3}
        )
    )
    assert [c["choices"][0]["delta"]["content"] for c in chunks] == ["go", " go", " go"]
