"""A replica's chat model: an MLflow chat model (``mlflow.pyfunc.ChatModel``, task ``agent/v1/chat`` or
``llm/v1/chat``) or agent (``mlflow.pyfunc.ResponsesAgent``, task ``agent/v1/responses``, what MLflow 3
recommends) answering whole or streamed, in the OpenAI chat-completions shapes. A ResponsesAgent gets the
messages as its ``input`` (a tool message is a 400: it has no function call to answer here) and its output
text is the answer; its text deltas are the stream's chunks.

``load_runtime`` loads any model once and returns the runtime that serves it: this one for a chat model,
``ModelRuntime`` (tabular scoring) for the rest. A stream is produced on its own thread (``ChatReplicaApp``
relays it) and stops between two chunks once its ``cancelled`` event is set: the generator is closed, so
the model's ``predict_stream`` sees ``GeneratorExit`` at its ``yield`` and nothing keeps running for a
client that went away. A whole (non-streamed) answer is one ``predict`` call and runs to its end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson

from serving.generative import sse
from serving.generative.chat import ChatRequest, completion_text, delta_text, estimate_tokens, usage_body, usage_of
from serving.replica_server.runtime import ModelRuntime

log = logging.getLogger(__name__)

CHAT_TASKS = frozenset({"agent/v1/chat", "llm/v1/chat"})
CHAT_LOADER = "mlflow.pyfunc.loaders.chat_model"
RESPONSES_TASK = "agent/v1/responses"
RESPONSES_LOADER = "mlflow.pyfunc.loaders.responses_agent"


class ChatModelError(Exception):
    """The chat model raised (only the exception's type is kept: its message may quote the prompt)."""


def is_chat_model(model: Any) -> bool:
    return _is_responses(model) or _loader(model) == CHAT_LOADER or _task(model) in CHAT_TASKS


def _loader(model: Any) -> str | None:
    return model.metadata.flavors.get("python_function", {}).get("loader_module")


def _task(model: Any) -> str | None:
    return (model.metadata.metadata or {}).get("task")


def _is_responses(model: Any) -> bool:
    return _loader(model) == RESPONSES_LOADER or _task(model) == RESPONSES_TASK


def load_runtime(model_uri: str, home: Path, store: Any = None) -> ModelRuntime | ChatRuntime:
    """The runtime for the model at ``model_uri``: a chat runtime for a chat model, else a scoring runtime."""
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(model_uri)
    if is_chat_model(model):
        log.info("loaded %s (a chat model; streaming: %s)", model_uri, "yes" if _streams(model) else "no")
        return ChatRuntime(model, model_uri)
    return ModelRuntime.from_model(model, model_uri, home, store)


def _streams(model: Any) -> bool:
    return bool(model.metadata.flavors.get("python_function", {}).get("streamable"))


class ChatRuntime:
    """One chat model. Batching and profiling do not apply (``plan`` stays None)."""

    plan = None
    numpy_path = None

    def __init__(self, model: Any, model_uri: str) -> None:
        self._model = model
        self.model_name = model_uri.removeprefix("models:/").split("/")[0]
        self.streams = _streams(model) or _is_responses(model)
        self.responses = _is_responses(model)

    def warm(self) -> None:
        """Nothing to warm: a chat model's first answer is its own."""

    def profile(self, **_: Any) -> None:
        """Chat answers are not batched."""

    def complete(self, request: ChatRequest, request_id: str) -> bytes:
        """The whole answer as a ``chat.completion`` object, with its usage."""
        model_input = _responses_input(request) if self.responses else request.model_input()
        try:
            answer = self._model.predict(model_input)
        except Exception as exc:
            raise ChatModelError(type(exc).__name__) from exc
        if self.responses and isinstance(answer, Mapping):
            answer = {
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": _output_text(answer)},
                    }
                ]
            }
        answer = dict(answer) if isinstance(answer, Mapping) else {"choices": []}
        prompt, completion = usage_of(answer) or (request.prompt_tokens(), estimate_tokens(completion_text(answer)))
        answer.update(
            id=f"chatcmpl-{request_id}",
            object="chat.completion",
            model=request.model or self.model_name,
            usage=usage_body(prompt, completion),
        )
        answer.setdefault("created", int(time.time()))
        return orjson.dumps(answer)

    def stream(self, request: ChatRequest, request_id: str, cancelled: threading.Event) -> Iterator[bytes]:
        """Server-sent events, one a chunk the model yields, then the usage chunk (if asked for) and
        ``[DONE]``; an error event instead of ``[DONE]`` if the model fails. Stops once ``cancelled``."""
        model_name = request.model or self.model_name
        head = {"id": f"chatcmpl-{request_id}", "object": "chat.completion.chunk", "model": model_name}
        created = int(time.time())
        reported: tuple[int, int] | None = None
        completion = 0
        if self.responses:
            chunks: Any = _deltas(self._model.predict_stream(_responses_input(request)))
        else:
            chunks = self._model.predict_stream(request.model_input()) if self.streams else iter([self._whole(request)])
        try:
            for chunk in chunks:
                if cancelled.is_set():
                    return
                chunk = dict(chunk) if isinstance(chunk, Mapping) else {}
                reported = usage_of(chunk) or reported
                text = delta_text(chunk)
                completion += max(1, estimate_tokens(text)) if text else 0
                chunk.pop("usage", None)
                yield sse.event(orjson.dumps({**chunk, **head, "created": chunk.get("created", created)}))
        except Exception as exc:
            log.error("chat model failed mid-stream on request %s: %s", request_id, type(exc).__name__)
            yield sse.error_event("INTERNAL_ERROR", f"the model failed while streaming; request id {request_id}")
            return
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # a generator left early (cancelled) runs its clean-up now
        if request.include_usage:
            prompt, completion = reported or (request.prompt_tokens(), completion)
            yield sse.event(
                orjson.dumps({**head, "created": created, "choices": [], "usage": usage_body(prompt, completion)})
            )
        yield sse.DONE_EVENT

    def _whole(self, request: ChatRequest) -> dict[str, Any]:
        """A model without ``predict_stream``: its whole answer as one chunk."""
        answer = orjson.loads(self.complete(request, "whole"))
        choice = (answer.get("choices") or [{}])[0]
        return {
            "choices": [{"index": 0, "delta": choice.get("message", {}), "finish_reason": choice.get("finish_reason")}],
            "usage": answer.get("usage"),
        }


def _responses_input(request: ChatRequest) -> dict[str, Any]:
    """A chat request as a ResponsesAgent's request: the messages as its input, the sampling params by their
    Responses names."""
    if any(m["role"] == "tool" or m.get("tool_calls") for m in request.messages):
        from serving.protocol.errors import invalid_parameter

        raise invalid_parameter("messages: tool calls are not taken by this model (a ResponsesAgent) through chat")
    body: dict[str, Any] = {"input": [{"role": m["role"], "content": m.get("content") or ""} for m in request.messages]}
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("custom_inputs", "custom_inputs"),
        ("user", "user"),
    ):
        if ours in request.params:
            body[theirs] = request.params[ours]
    if request.max_tokens is not None:
        body["max_output_tokens"] = request.max_tokens
    return body


def _output_text(answer: Mapping[str, Any]) -> str:
    """The text of a ResponsesAgent's output: its message items' ``output_text`` parts, in order."""
    return "".join(
        part.get("text", "")
        for item in answer.get("output") or []
        if isinstance(item, Mapping) and item.get("type") == "message"
        for part in item.get("content") or []
        if isinstance(part, Mapping) and part.get("type") == "output_text"
    )


def _deltas(events: Iterator[Any]) -> Iterator[dict[str, Any]]:
    """A ResponsesAgent's stream as chat chunks: one a text delta (other events carry no new text)."""
    try:
        for event in events:
            if isinstance(event, Mapping) and event.get("type") == "response.output_text.delta" and event.get("delta"):
                yield {"choices": [{"index": 0, "delta": {"role": "assistant", "content": str(event["delta"])}}]}
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
