"""A replica's scoring, apart from HTTP: a request (or the gateway's envelope of several) parsed, predicted
and answered, each call counted on the replica's busy clock and in its metrics.

Both run on the replica's one predict thread (``serving.replica_server.app``), never on its event loop; the
frame socket scores envelopes with the same ``score_envelope``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import nullcontext
from typing import Any

import numpy as np
import orjson
import pandas as pd

from serving.protocol import wire
from serving.protocol.errors import ApiError, error_body, internal
from serving.protocol.events import is_event_content_type, parse_event
from serving.protocol.scoring import JSON_CONTENT_TYPE, ScoringRequest, parse_scoring_request, to_jsonable
from serving.replica_server.metrics import ReplicaMetrics
from serving.replica_server.runtime import ModelError, ModelRuntime, Prediction

log = logging.getLogger(__name__)


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
    parsed: list[ScoringRequest | ApiError] = []
    for request in requests:
        try:
            parsed.append(parse_request(runtime, request.body, request.content_type, max_rows))
        except ApiError as err:
            parsed.append(err)
    good = [p for p in parsed if not isinstance(p, ApiError)]
    predicted: Iterator[Prediction | Exception]
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
    """One scoring request's status and body; with ``want_features`` the body adds the served features."""
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
