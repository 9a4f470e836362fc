"""Chat requests in the OpenAI / Databricks chat format: parsed, checked and shaped for an MLflow chat model.

One parser serves the gateway (which must know ``max_tokens`` and the prompt's size before the request
reaches a model: token budgets, the cache, fallbacks) and the replica (direct clients). A bad request is a
400 naming the field; no message quotes a value from the request.

Token counts are estimates unless the model reports its own usage: 4 bytes of UTF-8 a token, at least one
per message part or streamed chunk that carries text, plus 3 a message for the role and framing (about
what OpenAI's tokenizers give for English text).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

import orjson

from serving.protocol.errors import ApiError, invalid_parameter

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_TOKENS_LIMIT = 32_768
MAX_MESSAGES = 2_000
MAX_STOP = 4
_MAX_NAMES = 5  # unknown keys named in an error, each cut to 64 characters
# Passed to the model as they come (after their checks below); anything else is a 400 naming it.
_PARAMS = (
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "tools",
    "tool_choice",
    "custom_inputs",
    "user",
)
_ACCEPTED = frozenset(
    {
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "stream",
        "stream_options",
        "model",
        "client_request_id",
        "usage_context",
        "extra_params",
        *_PARAMS,
    }
)
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "refusal"})


def estimate_tokens(text: str) -> int:
    """Tokens in ``text``, estimated: 4 UTF-8 bytes a token, at least 1 for any text."""
    return math.ceil(len(text.encode("utf-8", "replace")) / 4) if text else 0


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]
    max_tokens: int | None
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage
    params: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, stop, ... as given
    model: str | None = None  # the OpenAI route's endpoint name

    @property
    def temperature(self) -> float | None:
        return self.params.get("temperature")

    def model_input(self) -> dict[str, Any]:
        """What an MLflow chat model's predict and predict_stream take."""
        body: dict[str, Any] = {"messages": list(self.messages), **self.params}
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def upstream_body(self, model: str | None, *, stream: bool) -> bytes:
        """The request as an OpenAI-compatible server takes it (a replica or an external model); a stream
        always asks for the usage chunk, which the gateway passes on only if its client asked."""
        body = self.model_input()
        if model is not None:
            body["model"] = model
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return orjson.dumps(body)

    def prompt_tokens(self) -> int:
        """The prompt's tokens, estimated (``estimate_tokens`` of each message's text, plus 3 a message)."""
        return 3 + sum(3 + estimate_tokens(message_text(m)) for m in self.messages)

    def cache_key(self) -> bytes | None:
        """The exact-match cache's key: only for ``temperature: 0`` (a deterministic answer)."""
        if self.temperature != 0:
            return None
        return orjson.dumps(self.model_input(), option=orjson.OPT_SORT_KEYS)

    def with_messages(self, messages: tuple[dict[str, Any], ...]) -> ChatRequest:
        return replace(self, messages=messages)


def message_text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def is_chat_body(body: bytes) -> dict[str, Any] | None:
    """The parsed body when it is a chat request (a JSON object with ``messages``), else None. Cheap for
    the tabular formats, which never carry the word."""
    if b'"messages"' not in body:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) and "messages" in parsed else None


def parse_chat_request(
    body: bytes | Mapping[str, Any], *, require_model: bool = False, max_tokens_limit: int = MAX_TOKENS_LIMIT
) -> ChatRequest:
    """A checked chat request; a 400 naming the first field that is wrong."""
    if isinstance(body, (bytes, bytearray)):
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ApiError(400, "MALFORMED_REQUEST", "the request body is not valid JSON") from None
    else:
        data = body
    if not isinstance(data, Mapping):
        raise invalid_parameter("the request body must be a JSON object with messages")
    unknown = _names(k for k in data if k not in _ACCEPTED)
    model = data.get("model")
    _check(model is None or (isinstance(model, str) and 0 < len(model) <= 63), "model must be the endpoint name")
    _check(not require_model or model is not None, "model is required: the name of the serving endpoint")
    # a body without messages is not a chat request at all (a dataframe_split sent to a chat endpoint, say):
    # that is the error to name first, with the fields that do not belong in one
    _check(
        "messages" in data,
        'messages is required: a chat request is {"messages": [{"role": ..., '
        '"content": ...}], ...}' + (f"; it takes no field(s) {unknown}" if unknown else ""),
    )
    _check(not unknown, f"unknown field(s) {unknown}; a chat request takes {sorted(_ACCEPTED)}")
    messages = _messages(data.get("messages"))
    limits = {k: data[k] for k in ("max_tokens", "max_completion_tokens") if data.get(k) is not None}
    for key, value in limits.items():
        _check(
            _is_int(value) and 1 <= value <= max_tokens_limit, f"{key} must be an integer from 1 to {max_tokens_limit}"
        )
    _check(len(set(limits.values())) <= 1, "max_tokens and max_completion_tokens differ: send one of them")
    limit = next(iter(limits.values()), None)
    stream = data.get("stream", False)
    _check(isinstance(stream, bool), "stream must be true or false")
    options = data.get("stream_options")
    _check(
        options is None
        or (
            isinstance(options, Mapping)
            and set(options) <= {"include_usage"}
            and isinstance(options.get("include_usage", False), bool)
        ),
        'stream_options must be {"include_usage": true|false}',
    )
    # taken for Databricks' query and then dropped: checked all the same, so a wrong one is named, not ignored
    _check(
        data.get("client_request_id") is None or isinstance(data["client_request_id"], str),
        "client_request_id must be a string",
    )
    for key in ("usage_context", "extra_params"):
        _check(data.get(key) is None or isinstance(data[key], Mapping), f"{key} must be an object")
    params = {k: data[k] for k in _PARAMS if k in data and data[k] is not None}
    _check_params(params)
    return ChatRequest(messages, limit, stream, bool(options and options.get("include_usage")), params, model)


def _messages(value: Any) -> tuple[dict[str, Any], ...]:
    _check(
        isinstance(value, list) and 1 <= len(value) <= MAX_MESSAGES,
        f"messages must be a list of 1 to {MAX_MESSAGES} messages",
    )
    out = []
    for i, message in enumerate(value):
        p = f"messages[{i}]"
        _check(isinstance(message, Mapping), f"{p} must be an object with role and content")
        unknown = _names(k for k in message if k not in _MESSAGE_KEYS)
        _check(not unknown, f"{p} has unknown field(s) {unknown}")
        _check(message.get("role") in ROLES, f"{p}.role must be one of {list(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # OpenAI's content parts: text parts only here
            _check(
                all(
                    isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
                    for part in content
                ),
                f'{p}.content parts must be {{"type": "text", "text": ...}}',
            )
            content = "".join(part["text"] for part in content)
        has_calls = message.get("role") == "assistant" and isinstance(message.get("tool_calls"), list)
        _check(isinstance(content, str) or (content is None and has_calls), f"{p}.content must be a string")
        _check(
            message.get("role") != "tool" or isinstance(message.get("tool_call_id"), str),
            f"{p}.tool_call_id is required for a tool message",
        )
        for key in ("name", "tool_call_id"):
            _check(message.get(key) is None or isinstance(message.get(key), str), f"{p}.{key} must be a string")
        out.append({k: v for k, v in {**message, "content": content}.items() if v is not None})
    return tuple(out)


def _check_params(params: Mapping[str, Any]) -> None:
    number = (int, float)
    t = params.get("temperature")
    _check(
        t is None or (isinstance(t, number) and not isinstance(t, bool) and 0 <= t <= 2),
        "temperature must be a number from 0 to 2",
    )
    top_p = params.get("top_p")
    _check(
        top_p is None or (isinstance(top_p, number) and not isinstance(top_p, bool) and 0 < top_p <= 1),
        "top_p must be a number above 0 and at most 1",
    )
    _check(
        params.get("n") is None or (_is_int(params["n"]) and params["n"] == 1),
        "n must be 1: one choice is served a request",
    )
    top_k = params.get("top_k")
    _check(top_k is None or (_is_int(top_k) and top_k >= 1), "top_k must be a positive integer")
    for key in ("frequency_penalty", "presence_penalty"):
        v = params.get(key)
        _check(
            v is None or (isinstance(v, number) and not isinstance(v, bool) and -2 <= v <= 2),
            f"{key} must be a number from -2 to 2",
        )
    stop = params.get("stop")
    _check(
        stop is None
        or isinstance(stop, str)
        or (isinstance(stop, list) and len(stop) <= MAX_STOP and all(isinstance(s, str) for s in stop)),
        f"stop must be a string or a list of up to {MAX_STOP} strings",
    )
    _check(params.get("tools") is None or isinstance(params["tools"], list), "tools must be a list")
    _check(
        params.get("tool_choice") is None or isinstance(params["tool_choice"], (str, Mapping)),
        "tool_choice must be a string or an object",
    )
    _check(
        params.get("custom_inputs") is None or isinstance(params["custom_inputs"], Mapping),
        "custom_inputs must be an object",
    )
    _check(params.get("user") is None or isinstance(params["user"], str), "user must be a string")


def _names(keys: Iterable[Any]) -> list[str]:
    """Keys the caller sent, for an error message: sorted, each cut short, at most ``_MAX_NAMES`` of them."""
    names = sorted(str(k)[:64] for k in keys)
    return names[:_MAX_NAMES] + ([f"... {len(names) - _MAX_NAMES} more"] if len(names) > _MAX_NAMES else [])


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise invalid_parameter(message)


# ---- answers ------------------------------------------------------------------------------------
def usage_of(answer: Mapping[str, Any]) -> tuple[int, int] | None:
    """(prompt, completion) tokens an answer or chunk reports, if it reports them."""
    usage = answer.get("usage")
    if not isinstance(usage, Mapping):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (_is_int(prompt) and _is_int(completion)):
        return None
    return int(prompt), int(completion)


def _first_choice_text(answer: Mapping[str, Any], part: str) -> str:
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return ""
    inner = choices[0].get(part)
    return message_text(inner) if isinstance(inner, Mapping) else ""


def completion_text(answer: Mapping[str, Any]) -> str:
    """The text of a whole answer's first choice."""
    return _first_choice_text(answer, "message")


def delta_text(chunk: Mapping[str, Any]) -> str:
    """The text a streamed chunk adds (its first choice's delta)."""
    return _first_choice_text(chunk, "delta")


def usage_body(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
