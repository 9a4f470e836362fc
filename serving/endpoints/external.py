"""External models as served entities, in Databricks' ``external_model`` shape.

A served entity may name a model another server runs instead of a registry model: provider ``openai``
(OpenAI itself or any OpenAI-compatible base URL), task ``llm/v1/chat``. Its API key is a secret reference
(``{{secrets/scope/key}}``, ``serving.generative.secrets``); a key in the config body
(``openai_api_key_plaintext``) is refused, so no key is ever stored, logged or returned with the config.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from serving.generative.secrets import is_reference
from serving.protocol.errors import invalid_parameter

_FORBID = ConfigDict(extra="forbid")
DEFAULT_OPENAI_BASE = "https://api.openai.com/v1"


class OpenAiConfigInput(BaseModel):
    model_config = _FORBID
    openai_api_key: str | None = Field(default=None, max_length=300)
    openai_api_key_plaintext: str | None = Field(default=None, max_length=1000)
    openai_api_base: str | None = Field(default=None, max_length=2048)
    openai_organization: str | None = Field(default=None, max_length=256)
    openai_api_type: Literal["openai"] | None = None


class ExternalModelInput(BaseModel):
    model_config = _FORBID
    name: str = Field(min_length=1, max_length=256)  # the upstream's model name
    provider: Literal["openai"]
    task: Literal["llm/v1/chat"]
    openai_config: OpenAiConfigInput

    @property
    def base_url(self) -> str:
        return (self.openai_config.openai_api_base or DEFAULT_OPENAI_BASE).rstrip("/")


def check_external(where: str, model: ExternalModelInput) -> None:
    """400 naming the field: a plaintext key, a key that is not a secret reference, a base URL that is
    not http(s)."""
    config = model.openai_config
    if config.openai_api_key_plaintext is not None:
        raise invalid_parameter(
            f"{where}.openai_config.openai_api_key_plaintext is not accepted: store the key as a "
            "secret and set openai_api_key to {{secrets/scope/key}}"
        )
    if config.openai_api_key is None or not is_reference(config.openai_api_key):
        raise invalid_parameter(
            f"{where}.openai_config.openai_api_key must be a secret reference {{{{secrets/scope/key}}}}"
        )
    base = urlsplit(model.base_url)
    if base.scheme not in ("http", "https") or not base.hostname or base.query or base.fragment:
        raise invalid_parameter(f"{where}.openai_config.openai_api_base must be an http(s) URL without query")


def external_view(model: ExternalModelInput) -> dict:
    """The config as GET returns it: the secret's reference, never a value."""
    return model.model_dump(mode="json", exclude_none=True)
