"""Each endpoint's AI gateway (``serving.generative.ai_gateway``) and the secrets its external models use.

The AI gateway a record holds applies to the endpoint's next request, with no replica restart; this keeps
each endpoint's parsed config for the chat plane, from the records this gateway wrote and from those another
gateway wrote. An external model's API key names a secret (``serving.generative.secrets``): a config naming
one that is not set is refused.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.store import EndpointStore
from serving.generative.ai_gateway import AiGatewayConfig, ai_gateway_view, parse_ai_gateway
from serving.generative.secrets import SecretMissing, Secrets
from serving.protocol.errors import invalid_parameter

log = logging.getLogger(__name__)


class AiGateways:
    def __init__(self, store: EndpointStore, secrets_dir: Path) -> None:
        self.store = store
        self.secrets = Secrets(secrets_dir)  # external models' API keys
        self._configs: dict[str, AiGatewayConfig] = {}  # each endpoint's, as its record has it

    def get(self, name: str) -> AiGatewayConfig | None:
        """Endpoint ``name``'s AI gateway (None before its record was read)."""
        return self._configs.get(name)

    async def put(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store the endpoint's AI gateway; it applies to the next request, no replica restarts."""
        config = parse_ai_gateway(body)
        record = await run_in_threadpool(self.store.get, name)
        record.ai_gateway = ai_gateway_view(config)
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.put, record)
        self._configs[name] = config
        return record.ai_gateway

    def remember(self, record: spec.EndpointRecord) -> None:
        """The AI gateway an endpoint's record holds, for its requests (records another gateway wrote too)."""
        try:
            self._configs[record.name] = parse_ai_gateway(record.ai_gateway or {})
        except Exception:
            log.error("endpoint %s: its stored ai_gateway is not valid any more; serving without it", record.name)
            self._configs[record.name] = AiGatewayConfig()

    def check_secrets(self, config: spec.EndpointCoreConfig) -> spec.EndpointCoreConfig:
        """``config``, or a 400 when an external model's API key names a secret that is not set."""
        for i, served_entity in enumerate(config.served_entities):
            if served_entity.external_model is not None:
                try:
                    self.secrets.read(str(served_entity.external_model.openai_config.openai_api_key))
                except SecretMissing as exc:
                    raise invalid_parameter(
                        f"served_entities[{i}].external_model.openai_config.openai_api_key: {exc}"
                    ) from None
        return config
