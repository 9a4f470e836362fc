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

A plain ASGI app on uvicorn rather than FastAPI: the replica has five fixed routes, and routing and
request objects cost more than its numpy path predicts a row. Requests are parsed, predicted and
serialised on one worker thread, so the event loop keeps reading the next request meanwhile; an envelope of
one request is scored on the event loop itself (no hop to the thread and back).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from serving.protocol import frames, wire
from serving.protocol.errors import (
    REQUEST_ID_HEADER,
    ApiError,
    error_body,
    internal,
    not_found,
    resolve_request_id,
    unauthenticated,
)
from serving.protocol.events import is_event_content_type, parse_event
from serving.protocol.scoring import JSON_CONTENT_TYPE, ScoringRequest, parse_scoring_request, to_jsonable
from serving.replica_server.metrics import ReplicaMetrics
from serving.replica_server.runtime import ModelError, ModelRuntime, Prediction, settle_heap

log = logging.getLogger(__name__)

RETURN_FEATURES_HEADER = "x-tollfree-return-features"
MAX_BODY_BYTES = 64 * 1024 * 1024
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def dumps_predictions(predictions: Any) -> bytes:
    """Predictions as JSON; numeric arrays straight from numpy (NaN becomes null, as ``to_jsonable`` does)."""
    if isinstance(predictions, np.ndarray) and predictions.dtype.kind in "fiub":
        return orjson.dumps(np.ascontiguousarray(predictions), option=orjson.OPT_SERIALIZE_NUMPY)
    return orjson.dumps(to_jsonable(predictions))


def dumps_features(features: pd.DataFrame | None) -> bytes:
    return b"" if features is None else orjson.dumps(to_jsonable(features))


def answer_for(result: Prediction | Exception, request_id: str, rows: int) -> wire.WireAnswer:
    if isinstance(result, Prediction):
        return wire.WireAnswer(200, rows, dumps_predictions(result.predictions), dumps_features(result.features))
    if isinstance(result, ApiError):
        return wire.WireAnswer(result.status_code, 0, orjson.dumps(error_body(result)), b"")
    log.error("model failed on request %s: %s", request_id, result)
    err = internal(f"the model failed on this input; request id {request_id}")
    return wire.WireAnswer(500, 0, orjson.dumps(error_body(err)), b"")


def parse_request(runtime: ModelRuntime, body: bytes, content_type: str | None, max_rows: int) -> ScoringRequest:
    """A scoring request (the MLflow protocol), or a stream event parsed by the model's input types."""
    if content_type != JSON_CONTENT_TYPE and is_event_content_type(content_type):
        return parse_event(body, runtime.event_fields)
    return parse_scoring_request(body, content_type, max_rows=max_rows)


def score_envelope(
    runtime: ModelRuntime, envelope: bytes, max_rows: int, metrics: ReplicaMetrics | None = None
) -> bytes:
    """Parse every request in the envelope, predict those that parsed as one batch, answer each (the
    whole call counted on the replica's busy clock)."""
    with metrics.busy if metrics is not None else nullcontext():
        return _score_envelope(runtime, envelope, max_rows, metrics)


def _score_envelope(runtime: ModelRuntime, envelope: bytes, max_rows: int, metrics: ReplicaMetrics | None) -> bytes:
    started = time.perf_counter()
    requests = wire.decode_requests(envelope)
    parsed: list[Any] = []
    for request in requests:
        try:
            parsed.append(parse_request(runtime, request.body, request.content_type, max_rows))
        except ApiError as err:
            parsed.append(err)
    good = [p for p in parsed if not isinstance(p, ApiError)]
    try:
        predicted = iter(runtime.predict_batch(good)) if good else iter(())
    except Exception as exc:  # a bug outside the model: every request in the batch gets a 500
        log.exception("batch predict failed")
        predicted = iter([ModelError(type(exc).__name__)] * len(good))
    answers = []
    for request, item in zip(requests, parsed):
        result = item if isinstance(item, ApiError) else next(predicted)
        answers.append(answer_for(result, request.request_id, 0 if isinstance(item, ApiError) else item.n_rows))
    if metrics is not None:
        metrics.observe_call(time.perf_counter() - started, (a.status for a in answers))
    return wire.encode_answers(answers)


def score_one(
    runtime: ModelRuntime,
    body: bytes,
    content_type: str | None,
    request_id: str,
    want_features: bool,
    max_rows: int,
    metrics: ReplicaMetrics | None = None,
) -> tuple[int, bytes]:
    with metrics.busy if metrics is not None else nullcontext():
        return _score_one(runtime, body, content_type, request_id, want_features, max_rows, metrics)


def _score_one(
    runtime: ModelRuntime,
    body: bytes,
    content_type: str | None,
    request_id: str,
    want_features: bool,
    max_rows: int,
    metrics: ReplicaMetrics | None,
) -> tuple[int, bytes]:
    started = time.perf_counter()
    try:
        parsed = parse_request(runtime, body, content_type, max_rows)
        result: Prediction | Exception = runtime.predict_request(parsed)
    except (ApiError, ModelError) as exc:
        result = exc
    answer = answer_for(result, request_id, 0)
    if metrics is not None:
        metrics.observe_call(time.perf_counter() - started, (answer.status,))
    if answer.status != 200:
        return answer.status, answer.first
    if want_features and answer.second:
        return 200, b'{"predictions":' + answer.first + b',"served_features":' + answer.second + b"}"
    return 200, answer.client_body()


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
        self._ready = orjson.dumps(
            {
                "status": "ready",
                "batching": plan,
                "numpy_path": runtime.numpy_path is not None,
                "model_uri": self.metrics.model_uri,
            }
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, lambda: self._worker.shutdown(wait=True))
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        request_id = resolve_request_id(headers.get(REQUEST_ID_HEADER.encode(), b"").decode("latin-1") or None)
        try:
            if await answer_probe(self, path, method, headers, send, request_id):
                pass
            elif path in ("/invocations", wire.PATH) and method == "POST":
                self._authorize(headers)
                body = await _read_body(receive)
                loop = asyncio.get_running_loop()
                if path == wire.PATH:
                    out = self.score_inline(body) if wire.single_request(body) else await self.score_threaded(body)
                    extra = [(wire.BUSY_HEADER.encode(), f"{self.metrics.busy.total():.6f}".encode())]
                    if self.frames_address is not None:
                        extra.append((frames.ADDRESS_HEADER.encode(), self.frames_address.encode()))
                    await _respond(send, 200, out, request_id, wire.CONTENT_TYPE, extra)
                else:
                    content_type = headers.get(b"content-type", b"").decode("latin-1") or None
                    want = headers.get(RETURN_FEATURES_HEADER.encode()) == b"1"
                    status, out = await loop.run_in_executor(
                        self._worker,
                        score_one,
                        self.runtime,
                        body,
                        content_type,
                        request_id,
                        want,
                        self.max_rows,
                        self.metrics,
                    )
                    await _respond(send, status, out, request_id)
            else:
                raise not_found(f"no route {method} {path[:100]}")
        except ApiError as err:
            await _respond(
                send,
                err.status_code,
                orjson.dumps(error_body(err)),
                request_id,
                extra=[(k.lower().encode(), v.encode()) for k, v in err.headers.items()],
            )
        except wire.WireError as exc:
            await _respond(
                send, 400, orjson.dumps({"error_code": "MALFORMED_REQUEST", "message": str(exc)}), request_id
            )
        except Exception:
            log.exception("unhandled error request_id=%s path=%s", request_id, path[:100])
            await _respond(
                send, 500, orjson.dumps(error_body(internal(f"internal error; request id {request_id}"))), request_id
            )

    def score_inline(self, envelope: bytes) -> bytes:
        """A batch envelope scored on the calling thread (a lone request: no hop to the predict thread)."""
        return score_envelope(self.runtime, envelope, self.max_rows, self.metrics)

    async def score_threaded(self, envelope: bytes) -> bytes:
        """A batch envelope scored on the predict thread, while the event loop reads the next calls."""
        return await asyncio.get_running_loop().run_in_executor(
            self._worker, score_envelope, self.runtime, envelope, self.max_rows, self.metrics
        )

    def _authorize(self, headers: dict[bytes, bytes]) -> None:
        if self._token is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self._token):
            raise unauthenticated("a valid bearer token is required")


async def answer_probe(
    app: Any, path: str, method: str, headers: dict[bytes, bytes], send: Any, request_id: str
) -> bool:
    """The routes every replica app has (its ``_ready`` answer, liveness, its metrics behind the token);
    True if ``path`` was one of them and is answered."""
    if method != "GET" or path not in ("/health/ready", "/health/live", "/metrics"):
        return False
    if path == "/health/ready":
        await _respond(send, 200, app._ready, request_id)
    elif path == "/health/live":
        await _respond(send, 200, b'{"status":"live"}', request_id)
    else:
        app._authorize(headers)
        await _respond(send, 200, app.metrics.exposition(), request_id, METRICS_CONTENT_TYPE)
    return True


async def _lifespan(receive: Any, send: Any, on_shutdown: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            on_shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _read_body(receive: Any) -> bytes:
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


async def _respond(
    send: Any,
    status: int,
    body: bytes,
    request_id: str,
    content_type: str = "application/json",
    extra: list[tuple[bytes, bytes]] | None = None,
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID_HEADER.encode(), request_id.encode()),
    ]
    if extra:
        headers.extend(extra)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
        from serving.replica_server.chat_app import ChatReplicaApp  # it builds on this module

        return ChatReplicaApp(runtime, token=token, metrics=metrics)
    return ReplicaApp(runtime, token=token, max_rows=max_rows, metrics=metrics)


class StandbyApp:
    """A warm-pool replica: the runtime imported, no model yet. ``POST /load {"model_uri": ...}`` (with the
    token) loads, warms and profiles the model, and from then on it is a ``ReplicaApp``. Until then
    ``/health/ready`` answers 503 and ``/health/live`` 200."""

    def __init__(self, home: Path, *, token: str | None, profile_budget_s: float = 0.3, store: Any = None) -> None:
        self.home = home
        self.store = store
        self.token = token
        self.profile_budget_s = profile_budget_s
        self.inner: Any = None  # ReplicaApp or ChatReplicaApp, once loaded
        self.frames_address: str | None = None  # handed to the ReplicaApp it becomes
        self._loading = asyncio.Lock()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":  # one long-lived call from start to stop, loaded or not
            await _lifespan(receive, send, lambda: self.inner._worker.shutdown(wait=True) if self.inner else None)
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
                await _respond(send, 200, b'{"status":"standby"}', request_id)
            elif path == "/health/ready" and method == "GET":
                await _respond(send, 503, b'{"status":"standby"}', request_id)
            elif path == "/load" and method == "POST":
                if self.token is not None and not hmac.compare_digest(
                    headers.get(b"authorization", b""), f"Bearer {self.token}".encode()
                ):
                    raise unauthenticated("a valid bearer token is required")
                try:
                    model_uri = orjson.loads(await _read_body(receive))["model_uri"]
                    assert isinstance(model_uri, str) and model_uri.startswith("models:/")
                except Exception:
                    raise ApiError(
                        400, "INVALID_PARAMETER_VALUE", 'body must be {"model_uri": "models:/NAME/VERSION"}'
                    ) from None
                async with self._loading:
                    if self.inner is None:
                        self.inner = await asyncio.get_running_loop().run_in_executor(None, self._load, model_uri)
                await _respond(send, 200, self.inner._ready, request_id)
            else:
                raise not_found(f"no route {method} {path[:100]}")
        except ApiError as err:
            await _respond(send, err.status_code, orjson.dumps(error_body(err)), request_id)
        except Exception as exc:
            log.exception("standby replica failed to load a model")
            err = internal(f"the model could not be loaded ({type(exc).__name__})")
            await _respond(send, 500, orjson.dumps(error_body(err)), request_id)

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
