"""Fakes shared by the tests that run the gateway app in-process: replicas that answer without a process.

``in_process_gateway`` builds the real gateway app (control plane, data plane, auth, dispatcher, inference
log) over one endpoint ``ep`` with one served entity ``m-1`` whose replica is a ``FakeReplica``; what the
replica answers is the ``send`` given (``FakeReplicas.send`` by default).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from serving.gateway.app import create_gateway_app
from serving.gateway.auth import Tokens
from serving.inference_log import InferenceLogWriter
from serving.protocol.errors import invalid_parameter
from serving.protocol.wire import ReplicaUnreachable, WireAnswer, WireReply, WireRequest
from serving.replicas.replica_set import ReplicaSet


@dataclass(eq=False)  # the dispatcher keys its readings by the replica's id, one per url here
class FakeReplica:
    url: str
    outstanding: int = 0
    up: bool = True
    reachable: bool = True

    pid: int | None = None

    @property
    def id(self) -> str:
        return f"fake:{self.url}"

    def alive(self) -> bool:
        return self.up


class FakeReplicas:
    """Answers every request of a batch with its own request id after ``delay_s``; records the batches."""

    def __init__(self, delay_s: float = 0.3) -> None:
        self.delay_s = delay_s
        self.batches: list[tuple[str, list[str]]] = []
        self.busy_s = 0.0  # the busy clock each reply carries (+0.25 s a batch)

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(self, replica: FakeReplica, requests: list[WireRequest]) -> WireReply:
        self.batches.append((replica.url, [r.request_id for r in requests]))
        await asyncio.sleep(self.delay_s)
        if not getattr(replica, "reachable", True):
            raise ReplicaUnreachable("connection refused")
        self.busy_s += 0.25
        return WireReply([WireAnswer(200, 1, json.dumps([r.request_id]).encode(), b"") for r in requests], self.busy_s)


def any_version(model: str, version: str | None, alias: str | None) -> str:
    return "1"


def no_registry(model: str, version: str | None, alias: str | None) -> str:
    """A registry that holds no model: every create is refused at resolution, and nothing starts."""
    raise invalid_parameter(f"registered model {model[:64]!r} has no such version")


Send = Callable[[Any, list[WireRequest]], Awaitable[WireReply]]


def in_process_gateway(
    tmp_path: Path,
    tokens: Tokens,
    *,
    send: Send | None = None,
    replicas: FakeReplicas | None = None,
    resolve: Callable[[str, str | None, str | None], str] = any_version,
    limit: int = 8,
    cache: Any = None,
    store: EndpointStore | None = None,
    replica_url: str = "http://replica",
    **app_options: Any,
) -> Any:
    """The gateway app over endpoint ``ep`` (entity ``m-1``, one fake replica at ``replica_url``, ``limit`` requests
    at once); its endpoint records in ``store`` (default: SQLite in ``tmp_path``)."""
    replicas = replicas or FakeReplicas(delay_s=0.0)
    manager = EndpointManager(
        store or EndpointStore(tmp_path / "endpoints.db"), resolve, {}, tmp_path / "logs", replica_client=replicas
    )
    entity = ReplicaSet("m-1", "m", "1", replicas=[FakeReplica(replica_url)], max_concurrency=limit)
    entity.attach(send or replicas.send)
    manager.live["ep"] = LiveEndpoint({"m-1": entity}, [("m-1", 100)], cache)
    return create_gateway_app(manager, tokens, InferenceLogWriter(tmp_path / "log"), **app_options)
