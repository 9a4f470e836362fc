from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.gateway.process import environ_with, start_gateway, wait_endpoint_ready
from serving.replicas.local import free_port
from tests.gateways import ENDPOINT, LiveGateway
from tests.world import MODEL_NAME, World

_STARTED: list[LiveGateway] = []  # the session gateway, once a test asked for it


@pytest.fixture(scope="session")
def gateway(world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveGateway]:
    """A real gateway process with a real replica of the champion behind the endpoint ``fraud``."""
    admin = os.environ["TOLLFREE_TOKEN"]
    scoped = "scoped-" + secrets.token_hex(16)
    tokens_file: Path = tmp_path_factory.mktemp("tokens") / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": [{"name": "app", "token": scoped, "endpoints": ["other"]}]}))
    grpc_port = free_port("127.0.0.1")  # the Open Inference Protocol's gRPC service
    env = environ_with({"TOLLFREE_TOKENS_FILE": str(tokens_file), "TOLLFREE_GRPC_PORT": str(grpc_port)})
    process = start_gateway(env, world.home / "logs" / "gateway-e2e.log")
    live = LiveGateway(process, admin, scoped, [], grpc=f"127.0.0.1:{grpc_port}")
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
        _STARTED.append(live)
        yield live
    finally:
        process.stop()


@pytest.fixture(scope="module", autouse=True)
def _only_the_sessions_endpoint_after_each_module() -> Iterator[None]:
    """The endpoints a module made on the session gateway are deleted when it ends (their replicas stop): the
    next module's flows that cover every endpoint (drift, canaries) then cover ``fraud`` and its own only, not
    every endpoint the worker's earlier modules left."""
    yield
    for live in _STARTED:
        with live.client(live.admin) as client:
            listed = client.get("/api/2.0/serving-endpoints")
            assert listed.status_code == 200, listed.text
            for endpoint in listed.json().get("endpoints", []):
                if endpoint["name"] != ENDPOINT:
                    deleted = client.delete(f"/api/2.0/serving-endpoints/{endpoint['name']}")
                    assert deleted.status_code == 200, deleted.text


@pytest.fixture(scope="module")
def inline_validation() -> None:
    """Great Expectations loaded in this process, so that the batch runs a test makes here validate their input
    inline (``serving.batch.validation_process``: a process that has it loaded has no import left to hide in a
    child) instead of each starting a child that imports it again. The child's path has tests of its own
    (tests/integration/test_validation_process.py); runs started as processes (the CLI) still take it."""
    import great_expectations  # noqa: F401  (imported for its effect on the validation mode)
