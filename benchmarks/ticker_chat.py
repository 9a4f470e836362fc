"""A test chat model (MLflow models-from-code): it answers with the words of the last user message, one
word a chunk, every ``interval_s`` seconds (``model_config``), up to ``max_tokens`` words (default 16),
cycling through the words when the message has fewer. Deterministic, so an answer can be checked.

Two words steer it for the fault tests: a last message of ``fail`` raises (a whole answer at once, a
stream after two chunks); ``slow``
waits ``interval_s`` * 50 before every chunk. With ``model_config["trace"]`` (a file path) it appends a
line for each generation that ends: ``finished N`` or ``closed N`` (N chunks sent), which is how the
tests see that a client's disconnect stopped the generation.

Log it with ``log_ticker(name, interval_s=0.02)``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
from mlflow.pyfunc import ChatModel
from mlflow.types.llm import (
    ChatChoice,
    ChatChoiceDelta,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessage,
    ChatParams,
)


class TickerChat(ChatModel):
    def load_context(self, context: Any) -> None:
        config = context.model_config or {}
        self.interval_s = float(config.get("interval_s", 0.02))
        self.trace = config.get("trace")

    def _words(self, messages: list[ChatMessage], params: ChatParams) -> list[str]:
        last = next((m.content for m in reversed(messages) if m.role == "user"), "") or "tick"
        words = last.split() or ["tick"]
        n = params.max_tokens or 16
        return [words[i % len(words)] for i in range(n)]

    def predict(self, context: Any, messages: list[ChatMessage], params: ChatParams) -> ChatCompletionResponse:
        words = self._words(messages, params)
        if words[0] == "fail":
            raise RuntimeError("the ticker was asked to fail")
        time.sleep(self.interval_s * len(words))
        return ChatCompletionResponse(
            choices=[ChatChoice(index=0, message=ChatMessage(role="assistant", content=" ".join(words)))]
        )

    def predict_stream(
        self, context: Any, messages: list[ChatMessage], params: ChatParams
    ) -> Iterator[ChatCompletionChunk]:
        words = self._words(messages, params)
        mode = words[0] if words else ""
        sent = 0
        try:
            for i, word in enumerate(words):
                time.sleep(self.interval_s * (50 if mode == "slow" else 1))
                if mode == "fail" and i == 2:
                    raise RuntimeError("the ticker was asked to fail")
                yield ChatCompletionChunk(
                    choices=[
                        ChatChunkChoice(
                            index=0, delta=ChatChoiceDelta(role="assistant", content=word if i == 0 else " " + word)
                        )
                    ]
                )
                sent += 1
            self._note(f"finished {sent}")
        except GeneratorExit:
            self._note(f"closed {sent}")
            raise

    def _note(self, line: str) -> None:
        if self.trace:
            with Path(self.trace).open("a") as f:
                f.write(line + "\n")


def log_ticker(name: str, *, interval_s: float = 0.02, trace: str | None = None) -> str:
    """Log and register the ticker as ``name``; its registered version."""
    config: dict[str, Any] = {"interval_s": interval_s}
    if trace:
        config["trace"] = trace
    from serving.registry.versions import state_experiment  # the file is also the logged model: imported here

    with mlflow.start_run(experiment_id=state_experiment("tickers")):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=__file__,
            model_config=config,
            registered_model_name=name,
            input_example={
                "messages": [{"role": "user", "content": "hello"}],
                "max_tokens": 2,
                "temperature": 0.0,
                "n": 1,
                "stream": False,
            },
        )
    return str(info.registered_model_version)


mlflow.models.set_model(TickerChat())
