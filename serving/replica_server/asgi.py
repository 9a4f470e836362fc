"""What every replica app (scoring, chat, standby) does the same way on ASGI: the lifespan, a body read
within its limit, an answer in one start and one body message, and the probes and metrics routes.

The apps are plain ASGI rather than FastAPI: a replica has a few fixed routes, and routing and request
objects cost more than its numpy path predicts a row.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from serving.protocol.errors import REQUEST_ID_HEADER, ApiError, resolve_request_id
from serving.replica_server.metrics import ReplicaMetrics

MAX_BODY_BYTES = 64 * 1024 * 1024
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REQUEST_ID = REQUEST_ID_HEADER.encode()


class ProbedApp(Protocol):
    """A loaded replica app, as its probes and metrics route read it."""

    ready_answer: bytes  # what ``/health/ready`` answers: the model and its batching plan
    metrics: ReplicaMetrics

    def authorize(self, headers: dict[bytes, bytes]) -> None:
        """Raise ApiError 401 unless the headers carry the replica token (when the replica has one)."""
        ...


async def lifespan(receive: Any, send: Any, on_shutdown: Callable[[], object]) -> None:
    """Answer the lifespan messages; ``on_shutdown`` runs when the server stops."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def http_request(
    scope: dict[str, Any], receive: Any, send: Any, on_shutdown: Callable[[], object]
) -> tuple[str, str, dict[bytes, bytes], str] | None:
    """An HTTP request's path, method, headers and request id; None once a lifespan (or any other non-HTTP)
    scope has been handled here, with ``on_shutdown`` run when the server stops."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send, on_shutdown)
        return None
    if scope["type"] != "http":
        return None
    headers = dict(scope["headers"])
    request_id = resolve_request_id(headers.get(_REQUEST_ID, b"").decode("latin-1") or None)
    return scope["path"], scope["method"], headers, request_id


async def read_body(receive: Any) -> bytes:
    """The request's body; ApiError 413 past ``MAX_BODY_BYTES``."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, "BAD_REQUEST", f"request body over the limit of {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def respond(
    send: Any,
    status: int,
    body: bytes,
    request_id: str,
    content_type: str = "application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """The whole answer: its status, length, request id and ``extra`` headers, then its body."""
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID_HEADER.encode(), request_id.encode()),
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def answer_probe(
    app: ProbedApp, path: str, method: str, headers: dict[bytes, bytes], send: Any, request_id: str
) -> bool:
    """The routes every loaded replica app has (its ready answer, liveness, its metrics behind the token);
    True if ``path`` was one of them and is answered."""
    if method != "GET" or path not in ("/health/ready", "/health/live", "/metrics"):
        return False
    if path == "/health/ready":
        await respond(send, 200, app.ready_answer, request_id)
    elif path == "/health/live":
        await respond(send, 200, b'{"status":"live"}', request_id)
    else:
        app.authorize(headers)
        await respond(send, 200, app.metrics.exposition(), request_id, METRICS_CONTENT_TYPE)
    return True
