"""A replica's chat runtime on real MLflow models (the ticker as a ``ChatModel`` and as a ``ResponsesAgent``,
logged from code and loaded back as a replica loads them), called in process: whole answers and streams in
the OpenAI shapes, usage, a cancelled stream closing the model's generator, a model failing mid-stream; and a
real replica process serving the agent, which must record no MLflow trace."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from serving.generative import sse
from serving.generative.chat import parse_chat_request
from serving.protocol.errors import ApiError
from serving.replica.chat import ChatModelError, ChatRuntime, load_runtime
from serving.replicas.local import start_replica, stop_replica, wait_ready

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ticker") / "trace.txt"


@pytest.fixture(scope="module")
def registered(trace: Path) -> dict[str, str]:
    """The ticker as a ``ChatModel`` and as a ``ResponsesAgent``, registered: their model URIs."""
    from benchmarks.ticker_agent import log_ticker_agent
    from benchmarks.ticker_chat import log_ticker

    return {"chat": f"models:/runtime-ticker/{log_ticker('runtime-ticker', interval_s=0.001, trace=str(trace))}",
            "agent": f"models:/runtime-agent/{log_ticker_agent('runtime-agent')}"}


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
    request = parse_chat_request({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a b"}],
                                  "max_tokens": 3, "model": "ep"})
    answer = orjson.loads(runtimes[kind].complete(request, "r1"))
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "a b a"}
    assert answer["id"] == "chatcmpl-r1" and answer["object"] == "chat.completion" and answer["model"] == "ep"
    assert answer["usage"]["prompt_tokens"] == request.prompt_tokens() and answer["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("kind", ["chat", "agent"])
def test_a_stream_is_one_chunk_a_token_then_usage_and_done(runtimes: dict[str, ChatRuntime], kind: str) -> None:
    request = parse_chat_request({"messages": [{"role": "user", "content": "x y"}], "max_tokens": 4, "stream": True,
                                  "stream_options": {"include_usage": True}})
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
    assert trace.read_text().splitlines()[len(before):] == ["closed 1"]


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
    # of it before counting, or they land in the count below (2 traces in ci56, where every process ran slowly)
    mlflow.flush_trace_async_logging()
    before = _traces()
    token = "chat-runtime-replica-token"
    # MLflow writes a trace when its call ends, not later in the background: a trace would be there at the answer
    env = {**os.environ, "TOLLFREE_REPLICA_TOKEN": token, "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING": "false"}
    replica = start_replica(registered["agent"], tmp_path, env)
    try:
        wait_ready(replica)
        for stream in (False, True):
            answer = httpx.post(f"{replica.url}/invocations", headers={"Authorization": f"Bearer {token}"}, timeout=30,
                                json={"messages": [{"role": "user", "content": "red green"}], "max_tokens": 3,
                                      "stream": stream})
            assert answer.status_code == 200 and b"red" in answer.content, answer.text
        traced = _traces() - before
    finally:
        stop_replica(replica)
    assert traced == 0, replica.log_path.read_text()
    assert not (ROOT / "mlruns").exists()
