from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from serving.gateway.process import GatewayProcess, environ_with, start_gateway, wait_endpoint_ready
from tests.world import MODEL_NAME, World

ENDPOINT = "fraud"


@dataclass
class LiveGateway:
    process: GatewayProcess
    admin: str
    scoped: str  # may only use the endpoint "other"
    sent: list[str]  # request ids sent through the data plane

    @property
    def url(self) -> str:
        return self.process.url

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def invoke(self, body: object, token: str | None = None, content_type: str = "application/json",
               endpoint: str = ENDPOINT) -> httpx.Response:
        request_id = secrets.token_hex(8)
        self.sent.append(request_id)
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        with self.client(token if token is not None else self.admin) as client:
            return client.post(f"/serving-endpoints/{endpoint}/invocations", content=content,
                               headers={"content-type": content_type, "x-request-id": request_id})


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
            created = client.post("/api/2.0/serving-endpoints", json={
                "name": ENDPOINT, "config": {"served_entities": [{"entity_name": MODEL_NAME, "entity_alias": "champion"}]}})
            assert created.status_code == 200, created.text
        wait_endpoint_ready(live.url, admin, ENDPOINT)
        yield live
    finally:
        process.stop()
