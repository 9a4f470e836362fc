"""Chat requests: what the gateway and a replica accept, what they refuse (400 naming the field, never the
value), and what a chat model is handed."""

from __future__ import annotations

import orjson
import pytest

from serving.generative.chat import (
    ChatRequest,
    completion_text,
    delta_text,
    estimate_tokens,
    is_chat_body,
    parse_chat_request,
    usage_of,
)
from serving.protocol.errors import ApiError

USER = {"role": "user", "content": "hello there"}


def test_a_request_keeps_its_messages_and_params_for_the_model() -> None:
    request = parse_chat_request(
        orjson.dumps(
            {
                "messages": [{"role": "system", "content": "be brief"}, USER],
                "max_tokens": 7,
                "temperature": 0.5,
                "stop": ["\n"],
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
    )
    assert request.stream and request.include_usage and request.max_tokens == 7
    assert request.model_input() == {
        "messages": [{"role": "system", "content": "be brief"}, USER],
        "temperature": 0.5,
        "stop": ["\n"],
        "max_tokens": 7,
    }
    upstream = orjson.loads(request.upstream_body("gpt", stream=True))
    assert (
        upstream["model"] == "gpt"
        and upstream["stream"] is True
        and upstream["stream_options"] == {"include_usage": True}
    )


def test_openai_content_parts_become_text_and_max_completion_tokens_counts() -> None:
    request = parse_chat_request(
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_completion_tokens": 3,
        }
    )
    assert request.messages[0]["content"] == "ab" and request.max_tokens == 3


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages must be a list"),
        ({"messages": [{"role": "robot", "content": "SECRET"}]}, "messages[0].role"),
        ({"messages": [USER, {"role": "user"}]}, "messages[1].content"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"messages": [{**USER, "colour": "SECRET"}]}, "messages[0] has unknown field(s) ['colour']"),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
        ({"messages": [USER], "max_tokens": True}, "max_tokens"),
        ({"messages": [USER], "temperature": -1}, "temperature"),
        ({"messages": [USER], "top_p": 0}, "top_p"),
        ({"messages": [USER], "n": 2}, "n must be 1"),
        ({"messages": [USER], "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": [USER], "stream": "yes"}, "stream must be"),
        ({"messages": [USER], "stream_options": {"other": 1}}, "stream_options"),
        ({"messages": [USER], "logit_bias": {"SECRET": 1}}, "unknown field(s) ['logit_bias']"),
        ({"dataframe_split": {"columns": ["SECRET"]}}, "messages is required: a chat request is"),
        ({"messages": [USER], "n": True}, "n must be 1"),
        ({"messages": [USER], "max_completion_tokens": 0}, "max_completion_tokens must be"),
        (
            {"messages": [USER], "max_tokens": 5, "max_completion_tokens": 6},
            "max_tokens and max_completion_tokens differ",
        ),
        ({"messages": [USER], "tool_choice": 1}, "tool_choice"),
        ({"messages": [USER], "client_request_id": 1}, "client_request_id"),
        ({"messages": [USER], "usage_context": "SECRET"}, "usage_context"),
    ],
)
def test_a_bad_field_is_a_400_naming_it_and_not_its_value(body: dict, field: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request(orjson.dumps(body))
    assert caught.value.status_code == 400
    assert field in caught.value.message
    assert "SECRET" not in caught.value.message or "logit_bias" in field  # a key named by the caller is the field


def test_a_body_with_no_messages_names_them_and_at_most_five_fields_that_do_not_belong() -> None:
    with pytest.raises(ApiError) as caught:
        parse_chat_request({f"k{i}": 1 for i in range(40)})
    assert caught.value.message.startswith("messages is required")
    assert (
        "'k0', 'k1', 'k10', 'k11', 'k12', '... 35 more']" in caught.value.message and "k13" not in caught.value.message
    )


def test_not_json_and_a_missing_model_on_the_openai_route() -> None:
    with pytest.raises(ApiError) as not_json:
        parse_chat_request(b"{nope")
    with pytest.raises(ApiError) as no_model:
        parse_chat_request({"messages": [USER]}, require_model=True)
    assert not_json.value.error_code == "MALFORMED_REQUEST"
    assert "model is required" in no_model.value.message


def test_only_a_temperature_zero_request_has_a_cache_key() -> None:
    hot = parse_chat_request({"messages": [USER], "temperature": 0.7})
    cold = parse_chat_request({"messages": [USER], "temperature": 0, "max_tokens": 5})
    same = parse_chat_request({"max_tokens": 5, "temperature": 0, "messages": [USER]})
    assert hot.cache_key() is None
    assert cold.cache_key() is not None and cold.cache_key() == same.cache_key()


def test_token_estimates() -> None:
    assert estimate_tokens("") == 0 and estimate_tokens("a") == 1 and estimate_tokens("abcdefgh") == 2
    request = ChatRequest(({"role": "user", "content": "abcd"},), None, False, False)
    assert request.prompt_tokens() == 3 + 3 + 1


def test_tabular_bodies_are_not_chat() -> None:
    assert is_chat_body(b'{"dataframe_records": [{"a": 1}]}') is None
    assert is_chat_body(b'{"dataframe_records": [{"messages": 1}]}') is None
    assert is_chat_body(b'{"messages": [') is None
    assert is_chat_body(b'{"messages": []}') == {"messages": []}


def test_answers_and_chunks_are_read_for_text_and_usage() -> None:
    answer = {
        "choices": [{"message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
    chunk = {"choices": [{"delta": {"content": " there"}}]}
    assert completion_text(answer) == "hi" and usage_of(answer) == (3, 1)
    assert delta_text(chunk) == " there" and usage_of(chunk) is None
    assert completion_text({"choices": []}) == "" and delta_text({}) == ""
