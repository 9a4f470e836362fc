from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.gateway.process import environ_with, start_gateway, wait_endpoint_ready
from tests.gateways import ENDPOINT, LiveGateway
from tests.world import MODEL_NAME, World


@pytest.fixture(scope="session")
def gateway(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """A real gateway process with a real replica of the champion behind the endpoint ``fraud``."""
    admin = os.environ["TOLLFREE_TOKEN"]
    scoped = "scoped-" + secrets.token_hex(16)
    tokens_file: Path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": [{"name": "app", "token": scoped, "endpoints": ["other"]}]}))
    env = environ_with({"TOLLFREE_TOKENS_FILE": str(tokens_file)})
    process = start_gateway(env, world.home / "logs" / "gateway-e2e.log")
    live = LiveGateway(process, admin, scoped, [])
    try:
        with live.client(admin) as client:
            created = client.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": ENDPOINT,
                    "config": {"served_entities": [{"entity_name": MODEL_NAME, "entity_alias": "champion"}]},
                },
            )
            assert created.status_code == 200, created.text
        wait_endpoint_ready(live.url, admin, ENDPOINT)
        yield live
    finally:
        process.stop()
