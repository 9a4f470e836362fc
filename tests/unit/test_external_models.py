"""External models as served entities: the config Databricks clients send, what is refused (a key in the body,
a key that is not a secret reference), secrets read by reference, and the order fallbacks take."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.endpoints import spec, validation, views
from serving.gateway.chat_plane import attempt_order
from serving.generative.secrets import SecretMissing, Secrets
from serving.protocol.errors import ApiError

REF = "{{secrets/openai/key}}"


def _config(external: dict, **entity: object) -> spec.EndpointCoreConfig:
    return spec.EndpointCoreConfig.model_validate(
        {
            "served_entities": [
                {
                    "external_model": {
                        "name": "gpt-4o-mini",
                        "provider": "openai",
                        "task": "llm/v1/chat",
                        "openai_config": external,
                    },
                    **entity,
                }
            ]
        }
    )


def test_an_external_model_needs_no_registry_and_shows_its_reference_only() -> None:
    config = validation.normalize_config(_config({"openai_api_key": REF, "openai_api_base": "http://127.0.0.1:9/v1"}))
    entity = config.served_entities[0]
    assert entity.name == "gpt-4o-mini" and entity.entity_name is None and spec.registry_entities(config) == []
    assert spec.traffic_weights(config) == [("gpt-4o-mini", 100)]
    assert entity.external_model is not None and entity.external_model.base_url == "http://127.0.0.1:9/v1"
    view = views.config_view(config, 1, {"deployment": "DEPLOYMENT_READY"})
    assert view["served_entities"][0]["external_model"]["openai_config"]["openai_api_key"] == REF


@pytest.mark.parametrize(
    ("external", "entity", "field"),
    [
        ({"openai_api_key_plaintext": "sk-SECRET"}, {}, "openai_api_key_plaintext is not accepted"),
        ({"openai_api_key": "sk-SECRET"}, {}, "openai_api_key must be a secret reference"),
        ({"openai_api_key": REF, "openai_api_base": "ftp://host/x"}, {}, "openai_api_base"),
        ({"openai_api_key": REF}, {"entity_name": "fraud"}, "set either external_model or entity_name"),
        ({"openai_api_key": REF}, {"min_replicas": 2}, "runs no replicas"),
    ],
)
def test_a_bad_external_model_is_a_400_naming_the_field(external: dict, entity: dict, field: str) -> None:
    with pytest.raises(ApiError) as caught:
        validation.normalize_config(_config(external, **entity))
    assert caught.value.status_code == 400 and field in caught.value.message
    assert "SECRET" not in caught.value.message


def test_an_entity_needs_a_model_of_one_kind_or_the_other() -> None:
    with pytest.raises(ApiError) as caught:
        validation.normalize_config(spec.EndpointCoreConfig.model_validate({"served_entities": [{"name": "x"}]}))
    assert "set entity_name" in caught.value.message


def test_secrets_are_read_by_reference_and_missing_ones_named(tmp_path: Path) -> None:
    (tmp_path / "openai").mkdir()
    (tmp_path / "openai" / "key").write_text("sk-live\n")
    secrets = Secrets(tmp_path)
    assert secrets.read(REF) == "sk-live"
    with pytest.raises(SecretMissing, match="openai/other is not set"):
        secrets.read("{{secrets/openai/other}}")
    with pytest.raises(SecretMissing):
        secrets.read("{{secrets/../key}}")


def test_fallbacks_follow_the_traffic_config_after_the_chosen_entity() -> None:
    weights = [("a", 80), ("b", 20), ("c", 0)]
    assert attempt_order(weights, "b", fallbacks=True) == ["b", "a", "c"]
    assert attempt_order(weights, "b", fallbacks=False) == ["b"]
