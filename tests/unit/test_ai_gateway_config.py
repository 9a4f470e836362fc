"""The AI gateway config: Databricks' put_ai_gateway body parsed, refused with a 400 naming the field, and
shown back in the same shape."""

from __future__ import annotations

import copy

import pytest

from serving.generative.ai_gateway import (
    MAX_RATE_LIMITS,
    AiGatewayConfig,
    RateLimitRule,
    ai_gateway_view,
    parse_ai_gateway,
)
from serving.protocol.errors import ApiError

DATABRICKS_BODY = {
    "usage_tracking_config": {"enabled": True},
    "rate_limits": [
        {"key": "endpoint", "calls": 1000, "tokens": 200000, "renewal_period": "minute"},
        {"key": "user", "calls": 5, "renewal_period": "minute"},
        {"key": "service_principal", "tokens": 5000, "principal": "batch-job", "renewal_period": "minute"},
    ],
    "guardrails": {
        "input": {"pii": {"behavior": "BLOCK"}, "safety": False, "invalid_keywords": [], "valid_topics": []},
        "output": {"pii": {"behavior": "MASK"}},
    },
    "inference_table_config": {
        "enabled": True,
        "catalog_name": "main",
        "schema_name": "logs",
        "table_name_prefix": "chat",
        "redact": ["email", "card_number"],
    },
    "fallback_config": {"enabled": True},
}


def refused(body) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse_ai_gateway(body)
    assert caught.value.status_code == 400 and caught.value.error_code == "INVALID_PARAMETER_VALUE"
    return caught.value


def with_rule(**rule) -> dict:
    return {"rate_limits": [{"key": "endpoint", "calls": 10}, rule]}


def test_a_databricks_body_parses():
    config = parse_ai_gateway(DATABRICKS_BODY)
    assert config == AiGatewayConfig(
        rate_limits=(
            RateLimitRule(key="endpoint", calls=1000, tokens=200000, principal=None),
            RateLimitRule(key="user", calls=5, tokens=None, principal=None),
            RateLimitRule(key="service_principal", calls=None, tokens=5000, principal="batch-job"),
        ),
        usage_tracking=True,
        fallbacks=True,
        input_pii="BLOCK",
        output_pii="MASK",
        redact=("card_number", "email"),
        inference_table=(
            ("enabled", True),
            ("catalog_name", "main"),
            ("schema_name", "logs"),
            ("table_name_prefix", "chat"),
        ),
    )


def test_the_view_is_databricks_shaped_and_round_trips():
    config = parse_ai_gateway(DATABRICKS_BODY)
    view = ai_gateway_view(config)
    assert view["rate_limits"] == DATABRICKS_BODY["rate_limits"]
    assert view["guardrails"] == {"input": {"pii": {"behavior": "BLOCK"}}, "output": {"pii": {"behavior": "MASK"}}}
    assert view["usage_tracking_config"] == {"enabled": True} and view["fallback_config"] == {"enabled": True}
    assert view["inference_table_config"] == {
        "enabled": True,
        "catalog_name": "main",
        "schema_name": "logs",
        "table_name_prefix": "chat",
        "redact": ["card_number", "email"],
    }
    assert parse_ai_gateway(view) == config
    assert ai_gateway_view(parse_ai_gateway(view)) == view


def test_an_empty_body_is_the_default_and_its_view_is_empty():
    assert parse_ai_gateway({}) == AiGatewayConfig()
    assert ai_gateway_view(AiGatewayConfig()) == {}
    assert parse_ai_gateway({"rate_limits": None, "guardrails": None}) == AiGatewayConfig()


def test_renewal_period_defaults_to_minute():
    config = parse_ai_gateway({"rate_limits": [{"key": "user", "tokens": 100}]})
    assert config.rate_limits == (RateLimitRule(key="user", calls=None, tokens=100, principal=None),)


@pytest.mark.parametrize(
    "body, field",
    [
        ([1, 2], "request body"),
        ("SECRETVALUE", "request body"),
        ({"usage_tracking_config": {"enabled": "SECRETVALUE"}}, "usage_tracking_config.enabled"),
        ({"fallback_config": "SECRETVALUE"}, "fallback_config"),
        ({"rate_limits": {"key": "SECRETVALUE"}}, "rate_limits"),
        ({"rate_limits": ["SECRETVALUE"]}, "rate_limits[0]"),
        (with_rule(key="SECRETVALUE", calls=1), "rate_limits[1].key"),
        (with_rule(calls=1), "rate_limits[1].key"),
        (with_rule(key="user_group", calls=1), "rate_limits[1].key"),
        (with_rule(key="user", calls=1, renewal_period="SECRETVALUE"), "rate_limits[1].renewal_period"),
        (with_rule(key="user", tokens=-987654), "rate_limits[1].tokens"),
        (with_rule(key="user", tokens=0), "rate_limits[1].tokens"),
        (with_rule(key="user", tokens=True), "rate_limits[1].tokens"),
        (with_rule(key="user", tokens=2.5), "rate_limits[1].tokens"),
        (with_rule(key="user", calls="SECRETVALUE"), "rate_limits[1].calls"),
        (with_rule(key="user"), "rate_limits[1]"),
        (with_rule(key="endpoint", calls=1, principal="SECRETVALUE"), "rate_limits[1].principal"),
        (with_rule(key="user", calls=1, principal=""), "rate_limits[1].principal"),
        (with_rule(key="user", calls=1, principal="SECRETVALUE" * 30), "rate_limits[1].principal"),
        ({"guardrails": {"input": {"safety": True}}}, "guardrails.input.safety"),
        ({"guardrails": {"output": {"safety": "SECRETVALUE"}}}, "guardrails.output.safety"),
        ({"guardrails": {"input": {"invalid_keywords": ["SECRETVALUE"]}}}, "guardrails.input.invalid_keywords"),
        ({"guardrails": {"output": {"valid_topics": ["SECRETVALUE"]}}}, "guardrails.output.valid_topics"),
        ({"guardrails": {"input": {"valid_topics": "SECRETVALUE"}}}, "guardrails.input.valid_topics"),
        ({"guardrails": {"input": {"pii": {"behavior": "SECRETVALUE"}}}}, "guardrails.input.pii.behavior"),
        ({"guardrails": {"output": {"pii": "SECRETVALUE"}}}, "guardrails.output.pii"),
        ({"inference_table_config": {"redact": ["SECRETVALUE"]}}, "inference_table_config.redact[0]"),
        ({"inference_table_config": {"redact": ["email", 7]}}, "inference_table_config.redact[1]"),
        ({"inference_table_config": {"catalog_name": ["SECRETVALUE"]}}, "inference_table_config.catalog_name"),
        ({"inference_table_config": {"enabled": "SECRETVALUE"}}, "inference_table_config.enabled"),
    ],
)
def test_each_bad_field_is_a_400_naming_it_without_its_value(body, field):
    err = refused(body)
    assert err.message.startswith(field + " "), err.message
    assert "SECRETVALUE" not in err.message and "987654" not in err.message


def test_user_group_limits_are_refused_because_tokens_have_no_groups():
    err = refused({"rate_limits": [{"key": "user_group", "calls": 5}]})
    assert "not supported" in err.message and "groups" in err.message


def test_safety_keywords_and_topics_are_refused_as_not_supported_here():
    for side in ("input", "output"):
        for guard in ({"safety": True}, {"invalid_keywords": ["x"]}, {"valid_topics": ["x"]}):
            assert "not supported here" in refused({"guardrails": {side: guard}}).message


@pytest.mark.parametrize(
    "body, path",
    [
        ({"bogus": 1}, "request body"),
        ({"rate_limits": [{"key": "user", "calls": 1, "bogus": 1}]}, "rate_limits[0]"),
        ({"guardrails": {"bogus": {}}}, "guardrails"),
        ({"guardrails": {"input": {"bogus": 1}}}, "guardrails.input"),
        ({"guardrails": {"input": {"pii": {"behavior": "NONE", "bogus": 1}}}}, "guardrails.input.pii"),
        ({"inference_table_config": {"bogus": 1}}, "inference_table_config"),
        ({"usage_tracking_config": {"enabled": True, "bogus": 1}}, "usage_tracking_config"),
    ],
)
def test_unknown_keys_at_any_level_are_named(body, path):
    err = refused(body)
    assert err.message.startswith(path + " ") and "'bogus'" in err.message


def test_an_unknown_key_name_is_cut_to_64_characters():
    err = refused({"k" * 64 + "TAIL": 1})
    assert "k" * 64 in err.message and "TAIL" not in err.message


def test_at_most_twenty_rate_limits():
    rule = {"key": "user", "calls": 1}
    assert len(parse_ai_gateway({"rate_limits": [rule] * MAX_RATE_LIMITS}).rate_limits) == 20
    assert refused({"rate_limits": [rule] * (MAX_RATE_LIMITS + 1)}).message.startswith("rate_limits ")


def test_parsing_does_not_change_the_body():
    body = copy.deepcopy(DATABRICKS_BODY)
    parse_ai_gateway(body)
    assert body == DATABRICKS_BODY
