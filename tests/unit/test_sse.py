"""Server-sent events cut into whole events as bytes arrive, however the bytes are split."""

from __future__ import annotations

import pytest

from serving.generative import sse


def test_events_come_out_whole_whatever_the_split() -> None:
    stream = b'data: {"a":1}\n\n: a comment\n\nevent: x\ndata: two\ndata: lines\n\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(stream)):
        splitter = sse.SseSplitter()
        got = [e for i in range(0, len(stream), size) for e in splitter.feed(stream[i : i + size])]
        assert got == [b'{"a":1}', b"two\nlines", sse.DONE], size
        assert not splitter.pending


def test_crlf_framing_and_an_unfinished_event() -> None:
    splitter = sse.SseSplitter()
    assert splitter.feed(b"data: one\r\n\r\ndata: tw") == [b"one"]
    assert splitter.pending
    assert splitter.feed(b"o\n\n") == [b"two"]


def test_an_event_without_an_end_is_bounded() -> None:
    splitter = sse.SseSplitter()
    with pytest.raises(sse.SseError):
        splitter.feed(b"data: " + b"x" * (sse.MAX_EVENT_BYTES + 1))


def test_encoding() -> None:
    assert sse.event(b"{}") == b"data: {}\n\n"
    assert sse.error_event("E", "m") == b'data: {"error":{"error_code":"E","message":"m"}}\n\n'
