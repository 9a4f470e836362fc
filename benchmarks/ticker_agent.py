"""The ticker as an MLflow ``ResponsesAgent`` (models-from-code), for the tests of MLflow 3's recommended
agent interface: it answers with the words of the last user message, one text delta a word, up to
``max_output_tokens`` words (default 16), ``interval_s`` apart (``model_config``).

Log it with ``log_ticker_agent(name)``.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import Any

import mlflow
from mlflow.pyfunc import ResponsesAgent
from mlflow.types.responses import ResponsesAgentRequest, ResponsesAgentResponse, ResponsesAgentStreamEvent


class TickerAgent(ResponsesAgent):
    def __init__(self) -> None:
        self.interval_s = 0.0

    def load_context(self, context: Any) -> None:
        self.interval_s = float((context.model_config or {}).get("interval_s", 0.0))

    def _words(self, request: ResponsesAgentRequest) -> list[str]:
        last = (
            next((str(m.content) for m in reversed(request.input) if getattr(m, "role", None) == "user"), "") or "tick"
        )
        words = last.split() or ["tick"]
        return [words[i % len(words)] for i in range(request.max_output_tokens or 16)]

    def predict(self, request: ResponsesAgentRequest) -> ResponsesAgentResponse:
        return ResponsesAgentResponse(
            output=[self.create_text_output_item(text=" ".join(self._words(request)), id="answer")]
        )

    def predict_stream(self, request: ResponsesAgentRequest) -> Generator[ResponsesAgentStreamEvent, None, None]:
        words = self._words(request)
        for i, word in enumerate(words):
            time.sleep(self.interval_s)
            yield ResponsesAgentStreamEvent(
                **self.create_text_delta(delta=word if i == 0 else " " + word, item_id="answer")
            )
        yield ResponsesAgentStreamEvent(
            type="response.output_item.done", item=self.create_text_output_item(text=" ".join(words), id="answer")
        )


def log_ticker_agent(name: str, *, interval_s: float = 0.0) -> str:
    """Log and register the agent as ``name``; its registered version."""
    from serving.registry.versions import state_experiment  # the file is also the logged model: imported here

    with mlflow.start_run(experiment_id=state_experiment("tickers")):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=__file__,
            model_config={"interval_s": interval_s},
            registered_model_name=name,
            # all it imports besides the standard library (MLflow would otherwise load it in a process to infer that)
            pip_requirements=["mlflow"],
            input_example={"input": [{"role": "user", "content": "hello"}], "max_output_tokens": 2},
        )
    return str(info.registered_model_version)


mlflow.models.set_model(TickerAgent())
