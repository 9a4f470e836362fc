"""A replica's chat runtime on real MLflow models (the ticker as a ``ChatModel`` and as a ``ResponsesAgent``,
logged from code and loaded back as a replica loads them), called in process: whole answers and streams in
the OpenAI shapes, usage, a cancelled stream closing the model's generator, a model failing mid-stream; a
real replica process serving the agent, which must record no MLflow trace; and the gateway app in process in
front of the chat model's replica app on loopback (real HTTP, the real replica client), where every malformed
request is a 400 naming the field on both the invocations route and the OpenAI-compatible one."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest
import uvicorn
from starlette.testclient import TestClient

from serving.gateway.auth import Tokens
from serving.generative import sse
from serving.generative.chat import parse_chat_request
from serving.protocol.errors import ApiError
from serving.replica_server.chat import ChatModelError, ChatRuntime, load_runtime
from serving.replica_server.chat_app import ChatReplicaApp
from serving.replicas.client import ReplicaClient
from serving.replicas.local import free_port, start_replica, stop_replica, wait_ready
from tests.fakes import in_process_gateway

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ticker") / "trace.txt"


@pytest.fixture(scope="module")
def registered(trace: Path) -> dict[str, str]:
    """The ticker as a ``ChatModel`` and as a ``ResponsesAgent``, registered: their model URIs."""
    from benchmarks.ticker_agent import log_ticker_agent
    from benchmarks.ticker_chat import log_ticker

    return {
        "chat": f"models:/runtime-ticker/{log_ticker('runtime-ticker', interval_s=0.001, trace=str(trace))}",
        "agent": f"models:/runtime-agent/{log_ticker_agent('runtime-agent')}",
    }


@pytest.fixture(scope="module")
def runtimes(session_home: Path, registered: dict[str, str]) -> Iterator[dict[str, ChatRuntime]]:
    loaded = {kind: load_runtime(uri, session_home) for kind, uri in registered.items()}
    assert all(isinstance(r, ChatRuntime) for r in loaded.values())
    # the agent's predict is traced by MLflow into the active experiment: one whose artifacts are in the state
    # folder (the default experiment on a SQLite registry would write them to ./mlruns)
    import mlflow

    from serving.registry.versions import state_experiment

    mlflow.set_experiment(experiment_id=state_experiment("chat-runtime"))
    yield loaded  # type: ignore[misc]
    mlflow.flush_trace_async_logging()  # the traces are written while the state folder still exists


def _events(stream: bytes | list[bytes]) -> list[bytes]:
    return sse.SseSplitter().feed(b"".join(stream) if isinstance(stream, list) else stream)


@pytest.mark.parametrize("kind", ["chat", "agent"])
def test_a_whole_answer_in_the_chat_completion_shape(runtimes: dict[str, ChatRuntime], kind: str) -> None:
    request = parse_chat_request(
        {
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a b"}],
            "max_tokens": 3,
            "model": "ep",
        }
    )
    answer = orjson.loads(runtimes[kind].complete(request, "r1"))
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "a b a"}
    assert answer["id"] == "chatcmpl-r1" and answer["object"] == "chat.completion" and answer["model"] == "ep"
    assert answer["usage"]["prompt_tokens"] == request.prompt_tokens() and answer["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("kind", ["chat", "agent"])
def test_a_stream_is_one_chunk_a_token_then_usage_and_done(runtimes: dict[str, ChatRuntime], kind: str) -> None:
    request = parse_chat_request(
        {
            "messages": [{"role": "user", "content": "x y"}],
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    events = _events(list(runtimes[kind].stream(request, "r2", threading.Event())))
    assert events[-1] == sse.DONE
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks[:-1]] == ["x", " y", " x", " y"]
    assert all(c["id"] == "chatcmpl-r2" and c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_a_cancelled_stream_closes_the_models_generator(runtimes: dict[str, ChatRuntime], trace: Path) -> None:
    before = trace.read_text().splitlines() if trace.exists() else []
    cancelled = threading.Event()
    request = parse_chat_request({"messages": [{"role": "user", "content": "go"}], "max_tokens": 50, "stream": True})
    got = []
    for event in runtimes["chat"].stream(request, "r3", cancelled):
        got.append(event)
        cancelled.set()  # the client left after the first chunk
    assert len(got) == 1
    assert trace.read_text().splitlines()[len(before) :] == ["closed 1"]


def test_a_model_failing_mid_stream_ends_with_an_error_event(runtimes: dict[str, ChatRuntime]) -> None:
    request = parse_chat_request({"messages": [{"role": "user", "content": "fail"}], "max_tokens": 5, "stream": True})
    events = _events(list(runtimes["chat"].stream(request, "r4", threading.Event())))
    assert len(events) == 3 and events[-1] != sse.DONE
    error = orjson.loads(events[-1])["error"]
    assert error["error_code"] == "INTERNAL_ERROR" and "r4" in error["message"]
    with pytest.raises(ChatModelError):
        runtimes["chat"].complete(parse_chat_request({"messages": [{"role": "user", "content": "fail"}]}), "r5")


def test_an_agent_takes_no_tool_messages(runtimes: dict[str, ChatRuntime]) -> None:
    request = parse_chat_request({"messages": [{"role": "tool", "content": "42", "tool_call_id": "c1"}]})
    with pytest.raises(ApiError) as caught:
        runtimes["agent"].complete(request, "r6")
    assert caught.value.status_code == 400 and "tool" in caught.value.message


def _traces() -> int:
    """How many MLflow traces the registry holds, in every experiment."""
    from mlflow import MlflowClient

    client = MlflowClient()
    experiments = [e.experiment_id for e in client.search_experiments()]
    return len(client.search_traces(locations=experiments, max_results=1000, include_spans=False))


def test_a_replica_process_serving_an_agent_records_no_trace(registered: dict[str, str], tmp_path: Path) -> None:
    """MLflow traces every call of a ``ResponsesAgent``; in a replica that is a registry write per request (and
    its artifacts in the default experiment's ./mlruns). The replica process samples traces at 0."""
    import mlflow

    # this process's own traces (the in-process agent of the tests before) are written by a background queue: out
    # of it before counting, or they land in the count below (they do when every process runs slowly)
    mlflow.flush_trace_async_logging()
    before = _traces()
    token = "chat-runtime-replica-token"
    # MLflow writes a trace when its call ends, not later in the background: a trace would be there at the answer
    env = {**os.environ, "TOLLFREE_REPLICA_TOKEN": token, "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false"}
    replica = start_replica(registered["agent"], tmp_path, env)
    try:
        wait_ready(replica)
        for stream in (False, True):
            answer = httpx.post(
                f"{replica.url}/invocations",
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
                json={"messages": [{"role": "user", "content": "red green"}], "max_tokens": 3, "stream": stream},
            )
            assert answer.status_code == 200 and b"red" in answer.content, answer.text
        traced = _traces() - before
    finally:
        stop_replica(replica)
    assert traced == 0, replica.log_path.read_text()
    assert not (ROOT / "mlruns").exists()


ADMIN = "chat-runtime-admin-token"
USER = {"role": "user", "content": "a b"}
# (body, what the error must name): every way a chat request can be wrong, the first two not chat requests at all
BAD = [
    ({"max_tokens": 16}, "messages is required"),
    ({"dataframe_split": {"columns": ["SECRET"], "data": [[1]]}}, "messages is required"),
    ({"messages": "SECRET"}, "messages must be a list"),
    ({"messages": []}, "messages must be a list"),
    ({"messages": ["SECRET"]}, "messages[0] must be an object"),
    ({"messages": [USER, {"content": "SECRET"}]}, "messages[1].role"),
    ({"messages": [{"role": 7, "content": "SECRET"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "SECRET"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": {"SECRET": 1}}]}, "messages[0].content"),
    ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
    ({"messages": [USER], "max_tokens": True}, "max_tokens"),
    ({"messages": [USER], "max_tokens": "16"}, "max_tokens"),
    ({"messages": [USER], "max_completion_tokens": -1}, "max_completion_tokens"),
    ({"messages": [USER], "temperature": 9}, "temperature"),
    ({"messages": [USER], "temperature": "SECRET"}, "temperature"),
    ({"messages": [USER], "n": 2}, "n must be 1"),
    ({"messages": [USER], "n": True}, "n must be 1"),
    ({"messages": [USER], "stream": "SECRET"}, "stream must be"),
    ({"messages": [USER], "tool_choice": 5}, "tool_choice"),
    ({"messages": [USER], "logit_bias": {"SECRET": 1}}, "unknown field(s) ['logit_bias']"),
    (b'["SECRET"]', "JSON object"),
    (b'{"messages": [SECRET', "not valid JSON"),
]


@pytest.fixture(scope="module")
def chat_gateway(runtimes: dict[str, ChatRuntime], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """The gateway app in process over endpoint ``ep``, whose one replica is the ticker's replica app, served by
    uvicorn on loopback and reached by the gateway's own replica client."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            ChatReplicaApp(runtimes["chat"]), host="127.0.0.1", port=port, log_level="warning", lifespan="off"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the replica app did not start"
        time.sleep(0.01)
    app = in_process_gateway(
        tmp_path_factory.mktemp("chat-gateway"),
        Tokens.from_environ({"TOLLFREE_TOKEN": ADMIN}),
        replicas=ReplicaClient(),
        replica_url=f"http://127.0.0.1:{port}",
    )  # type: ignore[arg-type]
    try:
        with TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}) as client:
            yield client
            app.state.manager.live.clear()  # the replica is this test's, not the gateway's to stop
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_chat_request_is_answered_through_the_gateway(chat_gateway: TestClient) -> None:
    answer = chat_gateway.post("/serving-endpoints/ep/invocations", json={"messages": [USER], "max_tokens": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "a b a"


@pytest.mark.parametrize(("body", "field"), BAD)
def test_a_malformed_chat_request_is_a_400_naming_the_field_on_both_routes(
    chat_gateway: TestClient, body: dict | bytes, field: str
) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    openai_raw = body if isinstance(body, bytes) else orjson.dumps({**body, "model": "ep"})
    json_type = {"content-type": "application/json"}
    invocations = chat_gateway.post("/serving-endpoints/ep/invocations", content=raw, headers=json_type)
    openai_route = chat_gateway.post("/serving-endpoints/chat/completions", content=openai_raw, headers=json_type)
    for answer in (invocations, openai_route):
        assert answer.status_code == 400, answer.text
        error = answer.json()
        assert set(error) == {"error_code", "message"} and field in error["message"], error
        assert error["error_code"] in ("INVALID_PARAMETER_VALUE", "MALFORMED_REQUEST")
        assert "SECRET" not in answer.text  # the value is never echoed
    assert invocations.json() == openai_route.json(), "one check, one message, on both routes"
