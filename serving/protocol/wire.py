"""The gateway-to-replica batch envelope: several scoring requests in one HTTP call, and their answers.

The gateway gathers concurrent requests for one served entity (``serving.traffic.dispatcher``) and sends them
to a replica as one ``POST /invocations/batch`` with content type ``application/x-tollfree-batch``:

    {"items": [[request_id, content_type, body_length], ...]}\\n<body 1><body 2>...

Bodies travel as the clients sent them (the gateway never parses them). The answer is

    {"items": [[status, rows, first_length, second_length], ...]}\\n<first 1><second 1><first 2>...

where, for status 200, ``first`` is the predictions' JSON and ``second`` the served features' JSON (empty
when the model reads none); for an error, ``first`` is the ``{"error_code", "message"}`` body and
``second`` is empty. The gateway builds the client's ``{"predictions": ...}`` body from ``first``
without parsing it, and logs ``first`` and ``second`` as they are.

Every envelope answer carries the replica's busy clock in ``BUSY_HEADER`` (seconds its predict calls
ran, ``serving.replica_server.metrics.BusyClock``): the autoscaler's utilisation signal. Replicas the gateway
starts accept calls only with the bearer token it puts in their environment as ``REPLICA_TOKEN_ENV``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson

CONTENT_TYPE = "application/x-tollfree-batch"
PATH = "/invocations/batch"
MAX_ITEMS = 1024
BUSY_HEADER = "x-tollfree-busy-s"
# An idle connection from the gateway to a replica: the gateway's pools keep it POOL_KEEP_ALIVE_S, and the replica
# keeps it longer, so the gateway never sends a request on a connection the replica is closing at that moment (a
# race that failed the request with a disconnect before any answer).
POOL_KEEP_ALIVE_S = 60
REPLICA_KEEP_ALIVE_S = 75
REPLICA_TOKEN_ENV = "TOLLFREE_REPLICA_TOKEN"
OWNER_ENV = "TOLLFREE_REPLICA_OWNER_PID"  # the pid of the gateway that starts a local replica (its owner)


class WireError(ValueError):
    """A malformed envelope: a bug or a stranger, never a client's payload problem."""


class ReplicaUnreachable(Exception):
    """The replica could not be reached or answered with something other than an envelope."""


@dataclass(frozen=True)
class WireRequest:
    request_id: str
    content_type: str
    body: bytes


@dataclass(frozen=True)
class WireAnswer:
    status: int
    rows: int
    first: bytes  # predictions JSON (200) or the error body
    second: bytes  # served features JSON (200, when any), else b""

    def client_body(self) -> bytes:
        return b'{"predictions":' + self.first + b"}" if self.status == 200 else self.first


@dataclass(frozen=True)
class WireReply:
    """A replica's reply to one envelope: the answers, one per request in order, and what the replica
    reported with them (its busy clock, from ``BUSY_HEADER``; None when it sent none)."""

    answers: list[WireAnswer]
    busy_s: float | None = None


def busy_reading(header: str | None) -> float | None:
    """The busy clock a ``BUSY_HEADER`` value carries (None when absent or not a number)."""
    if header is None:
        return None
    try:
        return float(header)
    except ValueError:
        return None


def _split(envelope: bytes) -> tuple[list, memoryview]:
    cut = envelope.find(b"\n")
    if cut < 0:
        raise WireError("envelope has no header line")
    try:
        header = orjson.loads(envelope[:cut])
    except orjson.JSONDecodeError:
        raise WireError("envelope header is not JSON") from None
    items = header.get("items") if isinstance(header, dict) else None
    if not isinstance(items, list) or len(items) > MAX_ITEMS:
        raise WireError(f"envelope header needs an 'items' list of at most {MAX_ITEMS}")
    return items, memoryview(envelope)[cut + 1 :]


def encode_requests(requests: Sequence[WireRequest]) -> bytes:
    header = orjson.dumps({"items": [[r.request_id, r.content_type, len(r.body)] for r in requests]})
    return b"".join([header, b"\n", *(r.body for r in requests)])


def decode_requests(envelope: bytes) -> list[WireRequest]:
    items, rest = _split(envelope)
    out: list[WireRequest] = []
    at = 0
    for item in items:
        if not (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], str)
            and isinstance(item[1], str)
            and isinstance(item[2], int)
            and item[2] >= 0
        ):
            raise WireError("envelope item must be [request_id, content_type, length]")
        end = at + item[2]
        if end > len(rest):
            raise WireError("envelope is shorter than its header says")
        out.append(WireRequest(item[0], item[1], bytes(rest[at:end])))
        at = end
    if at != len(rest):
        raise WireError("envelope is longer than its header says")
    return out


def encode_answers(answers: Sequence[WireAnswer]) -> bytes:
    header = orjson.dumps({"items": [[a.status, a.rows, len(a.first), len(a.second)] for a in answers]})
    parts = [header, b"\n"]
    for a in answers:
        parts.append(a.first)
        parts.append(a.second)
    return b"".join(parts)


def decode_answers(envelope: bytes, expected: int) -> list[WireAnswer]:
    items, rest = _split(envelope)
    if len(items) != expected:
        raise WireError(f"replica answered {len(items)} items for {expected} requests")
    out: list[WireAnswer] = []
    at = 0
    for item in items:
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(v, int) and v >= 0 for v in item)):
            raise WireError("answer item must be [status, rows, first_length, second_length]")
        mid, end = at + item[2], at + item[2] + item[3]
        if end > len(rest):
            raise WireError("answer envelope is shorter than its header says")
        out.append(WireAnswer(item[0], item[1], bytes(rest[at:mid]), bytes(rest[mid:end])))
        at = end
    return out
