"""A chat model's replica app: ``POST /invocations`` takes a chat request (``serving.generative.chat``) and
answers a ``chat.completion``, or with ``"stream": true`` server-sent events relayed as the model yields
them. Probes, ``/metrics`` and the token work as in ``ReplicaApp``.

The gateway sends a chat request (a body with ``messages``) to ``/invocations``; any other body for a chat
endpoint comes the way a tabular one does, in a batch envelope (``POST /invocations/batch``). Each of those
is answered with what ``parse_chat_request`` names as wrong (a 400: ``messages`` is required, say), the same
check and message the OpenAI-compatible route gives, rather than a 404 the gateway would take for a replica
it cannot reach. The answer names no frame socket, so the gateway keeps to HTTP for this replica.

Each answer runs on a thread of its own (a pool of up to ``max_streams``), not the scoring worker: a chat
answer takes seconds, and a replica holds many at once. The event loop sends each chunk as it comes (with
any others already waiting, in one write) and watches the connection: a client that goes away sets the
stream's ``cancelled`` event, and the runtime stops the model between two chunks.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from serving.generative import sse
from serving.generative.chat import parse_chat_request
from serving.protocol import wire
from serving.protocol.errors import (
    REQUEST_ID_HEADER,
    ApiError,
    error_body,
    internal,
    invalid_parameter,
    malformed_request,
    not_found,
    unauthenticated,
)
from serving.replica_server.asgi import answer_probe, http_request, read_body, respond
from serving.replica_server.chat import ChatModelError, ChatRuntime
from serving.replica_server.metrics import ReplicaMetrics

log = logging.getLogger(__name__)

DEFAULT_MAX_STREAMS = 1024


class ChatReplicaApp:
    def __init__(
        self,
        runtime: ChatRuntime,
        *,
        token: str | None = None,
        metrics: ReplicaMetrics | None = None,
        max_streams: int = DEFAULT_MAX_STREAMS,
    ) -> None:
        self.runtime = runtime
        self.metrics = metrics or ReplicaMetrics.create("unknown")
        self._token = f"Bearer {token}".encode() if token else None
        self._pool = ThreadPoolExecutor(max_streams, thread_name_prefix="chat")
        self.ready_answer = orjson.dumps(
            {
                "status": "ready",
                "kind": "chat",
                "batching": None,
                "numpy_path": False,
                "streaming": runtime.streams,
                "model_uri": self.metrics.model_uri,
            }
        )

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        incoming = await http_request(scope, receive, send, self.close)
        if incoming is None:
            return
        path, method, headers, request_id = incoming
        started = time.perf_counter()
        try:
            if await answer_probe(self, path, method, headers, send, request_id):
                return
            if path == wire.PATH and method == "POST":
                self.authorize(headers)
                answers = refuse_envelope(await read_body(receive))
                self.metrics.observe_call(time.perf_counter() - started, [a.status for a in answers])
                await respond(send, 200, wire.encode_answers(answers), request_id, wire.CONTENT_TYPE)
            elif path == "/invocations" and method == "POST":
                self.authorize(headers)
                request = parse_chat_request(await read_body(receive))
                if request.stream:
                    await self._stream(receive, send, request, request_id)
                else:
                    loop = asyncio.get_running_loop()
                    body = await loop.run_in_executor(self._pool, self.runtime.complete, request, request_id)
                    await respond(send, 200, body, request_id)
                self.metrics.observe_call(time.perf_counter() - started, (200,))
            else:
                raise not_found(f"no route {method} {path[:100]}")
        except ApiError as err:
            self.metrics.observe_call(time.perf_counter() - started, (err.status_code,))
            await respond(send, err.status_code, orjson.dumps(error_body(err)), request_id)
        except wire.WireError as exc:  # a malformed envelope: a bug or a stranger, named as ReplicaApp names it
            await respond(send, 400, orjson.dumps(error_body(malformed_request(str(exc)))), request_id)
        except ChatModelError as exc:
            log.error("chat model failed on request %s: %s", request_id, exc)
            failure = internal(f"the model failed on this input; request id {request_id}")
            await respond(send, 500, orjson.dumps(error_body(failure)), request_id)

    def authorize(self, headers: dict[bytes, bytes]) -> None:
        if self._token is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self._token):
            raise unauthenticated("a valid bearer token is required")

    def close(self) -> None:
        """The server stops: the answers under way are cancelled between two chunks, not waited for."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _stream(self, receive: Any, send: Any, request: Any, request_id: str) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        cancelled = threading.Event()

        def produce() -> None:
            try:
                for event in self.runtime.stream(request, request_id, cancelled):
                    loop.call_soon_threadsafe(queue.put_nowait, event)
            except Exception as exc:
                log.error("stream of request %s failed: %s", request_id, type(exc).__name__)
                loop.call_soon_threadsafe(queue.put_nowait, sse.error_event("INTERNAL_ERROR", "the stream failed"))
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, None)

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            cancelled.set()
            queue.put_nowait(None)

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", sse.CONTENT_TYPE.encode()),
                    (b"cache-control", b"no-cache"),
                    (REQUEST_ID_HEADER.encode(), request_id.encode()),
                ],
            }
        )
        watcher = loop.create_task(watch())
        loop.run_in_executor(self._pool, produce)
        try:
            while True:
                event = await queue.get()
                out = [event] if event is not None else []
                while event is not None and not queue.empty():  # what else is already here goes in the same write
                    event = queue.get_nowait()
                    if event is not None:
                        out.append(event)
                if out:
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if event is None:
                    break
            if not cancelled.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            cancelled.set()
            watcher.cancel()


def refuse_envelope(envelope: bytes) -> list[wire.WireAnswer]:
    """An answer for each request of a batch envelope: the 400 ``parse_chat_request`` raises for its body. The
    gateway sends a chat replica an envelope only for a body that is no JSON object with ``messages``, so each
    is refused naming the field; one that parses (no gateway sends it) is told where chat requests go.
    WireError if the envelope itself is malformed."""
    answers = []
    for request in wire.decode_requests(envelope):
        try:
            parse_chat_request(request.body)
            err = invalid_parameter("messages: a chat request is answered on POST /invocations, not in a batch")
        except ApiError as refused:
            err = refused
        answers.append(wire.WireAnswer(err.status_code, 0, orjson.dumps(error_body(err)), b""))
    return answers
