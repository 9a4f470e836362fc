"""A warm-pool replica: the runtime imported, no model yet (``python -m serving.replica_server --standby``).

``POST /load {"model_uri": ...}`` (with the replica token) loads, warms and profiles the model, and from then
on the standby answers as the app it became (``ReplicaApp``, or ``ChatReplicaApp`` for a chat model). Until
then ``/health/ready`` answers 503 and ``/health/live`` 200.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from pathlib import Path
from typing import Any

import orjson

from serving.heap import settle_heap
from serving.protocol.errors import ApiError, error_body, internal, not_found, resolve_request_id, unauthenticated
from serving.replica_server.app import ReplicaApp, create_replica_app
from serving.replica_server.asgi import lifespan, read_body, respond

log = logging.getLogger(__name__)


class StandbyApp:
    def __init__(self, home: Path, *, token: str | None, profile_budget_s: float = 0.3, store: Any = None) -> None:
        self.home = home
        self.store = store
        self.token = token
        self.profile_budget_s = profile_budget_s
        self.inner: Any = None  # ReplicaApp or ChatReplicaApp, once loaded
        self.frames_address: str | None = None  # handed to the ReplicaApp it becomes
        self._loading = asyncio.Lock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # one long-lived call from start to stop, loaded or not
            await lifespan(receive, send, lambda: self.inner.close() if self.inner is not None else None)
            return
        if self.inner is not None:
            await self.inner(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        request_id = resolve_request_id(None)
        try:
            if path == "/health/live" and method == "GET":
                await respond(send, 200, b'{"status":"standby"}', request_id)
            elif path == "/health/ready" and method == "GET":
                await respond(send, 503, b'{"status":"standby"}', request_id)
            elif path == "/load" and method == "POST":
                self._authorize(headers)
                model_uri = _model_uri(await read_body(receive))
                async with self._loading:
                    if self.inner is None:
                        self.inner = await asyncio.get_running_loop().run_in_executor(None, self._load, model_uri)
                await respond(send, 200, self.inner.ready_answer, request_id)
            else:
                raise not_found(f"no route {method} {path[:100]}")
        except ApiError as err:
            await respond(send, err.status_code, orjson.dumps(error_body(err)), request_id)
        except Exception as exc:
            log.exception("standby replica failed to load a model")
            failure = internal(f"the model could not be loaded ({type(exc).__name__})")
            await respond(send, 500, orjson.dumps(error_body(failure)), request_id)

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self.token is not None and not hmac.compare_digest(
            headers.get(b"authorization", b""), f"Bearer {self.token}".encode()
        ):
            raise unauthenticated("a valid bearer token is required")

    def _load(self, model_uri: str) -> Any:
        started = time.perf_counter()
        from serving.replica_server.chat import load_runtime

        runtime = load_runtime(model_uri, self.home, store=self.store)
        # a request waits for this: no separate warm-up call (profiling predicts the example first, which warms
        # the same path), and three timed runs a size instead of five
        runtime.profile(budget_s=self.profile_budget_s, runs=3)
        settle_heap()
        seconds = time.perf_counter() - started
        log.info("standby loaded %s in %.2fs", model_uri, seconds)
        app = create_replica_app(runtime, token=self.token, model_uri=model_uri, load_seconds=seconds)
        if isinstance(app, ReplicaApp):
            app.frames_address = self.frames_address
        return app


def _model_uri(body: bytes) -> str:
    """The model URI of a ``/load`` body; ApiError 400 naming the expected body otherwise."""
    try:
        model_uri = orjson.loads(body)["model_uri"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        model_uri = None
    if not isinstance(model_uri, str) or not model_uri.startswith("models:/"):
        raise ApiError(400, "INVALID_PARAMETER_VALUE", 'body must be {"model_uri": "models:/NAME/VERSION"}')
    return model_uri
