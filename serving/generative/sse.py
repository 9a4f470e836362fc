"""Server-sent events as OpenAI-compatible servers stream chat answers: ``data: <json>\\n\\n`` a chunk,
ending with ``data: [DONE]``.

``SseSplitter`` cuts a byte stream into whole events as they complete, so a relay passes each on the
moment its last byte arrives and never holds a complete event back.
"""

from __future__ import annotations

import orjson

CONTENT_TYPE = "text/event-stream"
DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"
MAX_EVENT_BYTES = 1024 * 1024


class SseError(Exception):
    """The stream is not server-sent events (or an event is over ``MAX_EVENT_BYTES``)."""


def event(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def error_event(error_code: str, message: str) -> bytes:
    """The event a stream ends with when it cannot go on (as OpenAI's API sends an error mid-stream)."""
    return event(orjson.dumps({"error": {"error_code": error_code, "message": message}}))


class SseSplitter:
    """Feed bytes as they arrive; get back each complete event's ``data`` (its data lines joined by \\n),
    in order. Comments (``:``) and other fields (``event:``, ``id:``) are dropped."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        out: list[bytes] = []
        start = 0
        while True:
            end, width = _boundary(buffer, start)
            if end < 0:
                break
            data = _data(buffer[start:end])
            if data is not None:
                out.append(data)
            start = end + width
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise SseError(f"an event is over {MAX_EVENT_BYTES} bytes")
        return out

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are waiting."""
        return bool(self._buffer.strip())


def _boundary(buffer: bytes, start: int) -> tuple[int, int]:
    """Where the next blank line (the end of an event) starts, and its width; (-1, 0) if none yet."""
    found = [(i, w) for i, w in ((buffer.find(b"\n\n", start), 2), (buffer.find(b"\r\n\r\n", start), 4)) if i >= 0]
    return min(found) if found else (-1, 0)


def _data(block: bytes) -> bytes | None:
    lines = [
        line[5:].lstrip(b" ") if line.startswith(b"data:") else None
        for line in block.replace(b"\r\n", b"\n").split(b"\n")
    ]
    data = [line for line in lines if line is not None]
    return b"\n".join(data) if data else None
