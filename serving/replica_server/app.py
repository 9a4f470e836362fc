"""One model replica: an OS process that loads one MLflow model and answers the scoring protocol.

``python -m serving.replica_server --model-uri models:/NAME/VERSION --host 127.0.0.1 --port PORT``.
It is ready (``/health/ready`` 200) only after the model is loaded, warmed and profiled; the ready
answer carries the micro-batching plan (``serving.traffic.batching``) the gateway follows.

Routes: ``POST /invocations`` (one scoring request, the MLflow protocol, for direct clients and
probes), ``POST /invocations/batch`` (the gateway's envelope of several, ``serving.protocol.wire``; its answer
names the Unix socket where the same envelopes are taken in frames, ``serving.protocol.frames``),
``GET /health/ready`` and ``GET /health/live`` (probes; no token), ``GET /metrics`` (Prometheus,
``serving.replica_server.metrics``). When ``TOLLFREE_REPLICA_TOKEN`` is set (the gateway sets it for the replicas
it starts) every route but the probes requires it as a bearer token. Both scoring routes also take a
stream event (one row; content type ``application/x-tollfree-event+json``, ``serving.protocol.events``),
its strings parsed by the model's input types.

A plain ASGI app (``serving.replica_server.asgi``); the scoring itself is ``serving.replica_server.scoring``.
Every request is parsed, predicted and serialised on one predict thread, never on the event loop: the loop
keeps reading the next requests and answers the probes at once, however long a predict takes.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from serving.protocol import frames, wire
from serving.protocol.errors import ApiError, error_body, internal, not_found, unauthenticated
from serving.replica_server.asgi import answer_probe, http_request, read_body, respond
from serving.replica_server.metrics import ReplicaMetrics
from serving.replica_server.runtime import ModelRuntime
from serving.replica_server.scoring import score_envelope, score_one

log = logging.getLogger(__name__)

RETURN_FEATURES_HEADER = "x-tollfree-return-features"


class ReplicaApp:
    """The ASGI application."""

    def __init__(
        self,
        runtime: ModelRuntime,
        *,
        token: str | None = None,
        max_rows: int = 10_000,
        metrics: ReplicaMetrics | None = None,
    ) -> None:
        self.runtime = runtime
        self.max_rows = max_rows
        self.metrics = metrics or ReplicaMetrics.create("unknown")
        self._token = f"Bearer {token}".encode() if token else None
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="predict")
        self.frames_address: str | None = None  # where it takes framed calls (``frames_server``), if it does
        plan = runtime.plan.to_json() if runtime.plan is not None else None
        self.ready_answer = orjson.dumps(
            {
                "status": "ready",
                "batching": plan,
                "numpy_path": runtime.numpy_path is not None,
                "model_uri": self.metrics.model_uri,
            }
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        incoming = await http_request(scope, receive, send, self.close)
        if incoming is None:
            return
        path, method, headers, request_id = incoming
        try:
            if await answer_probe(self, path, method, headers, send, request_id):
                pass
            elif path == wire.PATH and method == "POST":
                self.authorize(headers)
                await self._envelope(await read_body(receive), send, request_id)
            elif path == "/invocations" and method == "POST":
                self.authorize(headers)
                await self._one(await read_body(receive), headers, send, request_id)
            else:
                raise not_found(f"no route {method} {path[:100]}")
        except ApiError as err:
            await respond(
                send,
                err.status_code,
                orjson.dumps(error_body(err)),
                request_id,
                extra=[(k.lower().encode(), v.encode()) for k, v in err.headers.items()],
            )
        except wire.WireError as exc:
            await respond(send, 400, orjson.dumps({"error_code": "MALFORMED_REQUEST", "message": str(exc)}), request_id)
        except Exception:
            log.exception("unhandled error request_id=%s path=%s", request_id, path[:100])
            await respond(
                send, 500, orjson.dumps(error_body(internal(f"internal error; request id {request_id}"))), request_id
            )

    async def _envelope(self, body: bytes, send: Any, request_id: str) -> None:
        """The gateway's batch envelope, answered with the busy clock and the frame socket's address."""
        out = await self.score_threaded(body)
        extra = [(wire.BUSY_HEADER.encode(), f"{self.metrics.busy.total():.6f}".encode())]
        if self.frames_address is not None:
            extra.append((frames.ADDRESS_HEADER.encode(), self.frames_address.encode()))
        await respond(send, 200, out, request_id, wire.CONTENT_TYPE, extra)

    async def _one(self, body: bytes, headers: dict[bytes, bytes], send: Any, request_id: str) -> None:
        """One scoring request (a direct client, a probe), on the predict thread."""
        content_type = headers.get(b"content-type", b"").decode("latin-1") or None
        want = headers.get(RETURN_FEATURES_HEADER.encode()) == b"1"
        status, out = await asyncio.get_running_loop().run_in_executor(
            self._worker, score_one, self.runtime, body, content_type, request_id, want, self.max_rows, self.metrics
        )
        await respond(send, status, out, request_id)

    async def score_threaded(self, envelope: bytes) -> bytes:
        """A batch envelope scored on the predict thread, while the event loop reads the next calls."""
        return await asyncio.get_running_loop().run_in_executor(
            self._worker, score_envelope, self.runtime, envelope, self.max_rows, self.metrics
        )

    def authorize(self, headers: dict[bytes, bytes]) -> None:
        if self._token is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self._token):
            raise unauthenticated("a valid bearer token is required")

    def close(self) -> None:
        """The server stops: the predict thread finishes the call it runs."""
        self._worker.shutdown(wait=True)


def create_replica_app(
    runtime: Any,
    *,
    token: str | None = None,
    max_rows: int = 10_000,
    model_uri: str = "unknown",
    load_seconds: float | None = None,
) -> Any:
    """The app for a loaded runtime: ``ReplicaApp`` for scoring, ``ChatReplicaApp`` for a chat model."""
    metrics = ReplicaMetrics.create(model_uri, load_seconds)
    if not isinstance(runtime, ModelRuntime):
        from serving.replica_server.chat_app import ChatReplicaApp  # it builds on this module's siblings

        return ChatReplicaApp(runtime, token=token, metrics=metrics)
    return ReplicaApp(runtime, token=token, max_rows=max_rows, metrics=metrics)
