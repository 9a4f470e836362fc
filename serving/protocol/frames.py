"""The gateway-to-replica hop without HTTP: the batch envelopes of ``serving.protocol.wire`` in length-prefixed
frames on one long-lived Unix socket connection, for replicas on the gateway's own machine.

A frame costs the gateway about a quarter of the CPU of an HTTP call on that hop and about a third of its round
trip, one call in flight (``python -m benchmarks.hop`` measures both; docs/benchmarks/peers.md has the figures),
and the replica's uvicorn parsing and answering is spared too. Every replica still answers HTTP: probes, direct
clients and the first envelope of each gateway go there, and the replica's HTTP answer names its frame address
(``ADDRESS_HEADER``), which the gateway uses from then on.

Each frame is ``HEADER`` (kind, call id, payload length; network byte order) followed by the payload:

- ``HELLO`` (call id 0): the replica token, UTF-8 (empty when the replica has none). The first frame of
  every connection; a replica with a token closes a connection whose first frame is not a hello with it (a
  ``FAILED`` frame with call id 0 says why).
- ``CALL``: a request envelope (``wire.encode_requests``). Several calls may be in flight on one
  connection; the call id pairs each with its answer, which may come back in another order.
- ``ANSWER``: the replica's busy clock (``BUSY``, a double: ``wire.BUSY_HEADER``'s figure) followed by the
  answer envelope (``wire.encode_answers``).
- ``FAILED``: the call could not be answered (a malformed envelope, a bug, a stopping replica, one with no
  scoring model loaded); the payload says why, UTF-8. The gateway retries such a call once on another replica.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HELLO, CALL, ANSWER, FAILED = 1, 2, 3, 4
HEADER = struct.Struct("!BII")
BUSY = struct.Struct("!d")
MAX_CALL = 64 * 1024 * 1024  # the replica's HTTP body limit: a larger envelope goes over HTTP (and gets its 413)
MAX_ANSWER = 2**32 - 1  # what a frame's length can say: the replica's answer has no limit over HTTP either
MAX_HELLO = 4096  # before the token is checked, a replica reads no more than this
ADDRESS_HEADER = "x-tollfree-frames"
_KINDS = (HELLO, CALL, ANSWER, FAILED)


class FrameError(ValueError):
    """The stream is not frames: an unknown kind, or a payload over the reader's limit."""


@dataclass(frozen=True)
class Frame:
    kind: int
    call_id: int
    payload: bytes


def frame(kind: int, call_id: int, payload: bytes) -> bytes:
    return HEADER.pack(kind, call_id, len(payload)) + payload


def answer_payload(busy_s: float, envelope: bytes) -> bytes:
    return BUSY.pack(busy_s) + envelope


def split_answer(payload: bytes) -> tuple[float, bytes]:
    """An ``ANSWER`` payload's busy clock and answer envelope."""
    if len(payload) < BUSY.size:
        raise FrameError("answer frame shorter than its busy clock")
    return BUSY.unpack_from(payload)[0], payload[BUSY.size :]


class FrameReader:
    """Bytes in, whole frames out: ``feed`` what the connection received, get the frames it completed.
    ``max_payload`` is checked on each frame's header, before its payload is buffered; the owner may change it
    (a replica reads at most ``MAX_HELLO`` until the hello is checked)."""

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames: list[Frame] = []
        at = 0
        size = len(self._buffer)
        while size - at >= HEADER.size:
            kind, call_id, length = HEADER.unpack_from(self._buffer, at)
            if kind not in _KINDS:
                raise FrameError(f"unknown frame kind {kind}")
            if length > self.max_payload:
                raise FrameError(f"frame payload of {length} bytes is over the limit of {self.max_payload}")
            end = at + HEADER.size + length
            if end > size:
                break
            frames.append(Frame(kind, call_id, bytes(self._buffer[at + HEADER.size : end])))
            at = end
            if kind == HELLO:
                break  # the owner checks it (and may raise the limit) before it reads on
        if at:
            del self._buffer[:at]
        return frames


def unix_path(address: str) -> str:
    """The socket path of a ``unix:@NAME`` address: a name in Linux's abstract namespace, which belongs to the
    network namespace as a loopback port does (no file to leave behind or to point at); FrameError otherwise."""
    name = address[len("unix:@") :] if address.startswith("unix:@") else ""
    if not name or len(name.encode()) > 106:
        raise FrameError(f"frame address must be unix:@NAME (a name of at most 106 bytes), not {address[:100]!r}")
    return "\0" + name
