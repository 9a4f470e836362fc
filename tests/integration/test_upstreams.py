"""The gateway's hop to chat upstreams against real sockets on loopback: a pooled connection the server drops
before answering is tried once more on a new one; a closed port, a silent server, a 5xx and a 429 are named."""

from __future__ import annotations

import asyncio
import socket

import pytest

from serving.gateway.upstream import Target, UpstreamFailed, Upstreams, read_whole

OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def _server(answers: list[bytes | None]) -> tuple[asyncio.Server, list[int]]:
    """Each connection reads one request, then sends the next answer (None: closes without a word)."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        seen.append(1)
        answer = answers.pop(0) if answers else OK
        if answer is not None:
            writer.write(answer)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def _target(port: int) -> Target:
    return Target("entity", f"http://127.0.0.1:{port}/chat/completions", {}, external=True)


def test_a_connection_dropped_before_the_answer_is_tried_once_more() -> None:
    body, connections = asyncio.run(_dropped_once())
    assert body == b"{}" and connections == 2


def test_dropped_twice_a_closed_port_a_silent_server_a_5xx_and_a_429_are_named() -> None:
    failures = asyncio.run(_failures())
    assert [f.status for f in failures] == [None, 503, 429, None, None]


async def _dropped_once() -> tuple[bytes, int]:
    server, seen = await _server([None])
    upstreams = Upstreams(idle_timeout_s=5)
    try:
        response = await upstreams.open_chat(_target(server.sockets[0].getsockname()[1]), b"{}")
        return await read_whole(_target(0), response), len(seen)
    finally:
        await upstreams.close()
        server.close()


async def _failures() -> list[UpstreamFailed]:
    server, _ = await _server(
        [
            None,
            None,
            b"HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 429 Slow down\r\nretry-after: 7\r\ncontent-length: 0\r\n\r\n",
        ]
    )
    port = server.sockets[0].getsockname()[1]
    silent = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    upstreams = Upstreams(idle_timeout_s=1)
    try:
        with pytest.raises(UpstreamFailed) as dropped:
            await upstreams.open_chat(_target(port), b"{}")
        with pytest.raises(UpstreamFailed) as busy:
            await upstreams.open_chat(_target(port), b"{}")
        with pytest.raises(UpstreamFailed) as limited:
            await upstreams.open_chat(_target(port), b"{}")
        with pytest.raises(UpstreamFailed) as refused:
            await upstreams.open_chat(_target(closed_port), b"{}")
        with pytest.raises(UpstreamFailed) as quiet:
            await upstreams.open_chat(_target(silent.getsockname()[1]), b"{}")
    finally:
        await upstreams.close()
        server.close()
        silent.close()
    assert dropped.value.status is None and "Disconnected" in dropped.value.reason
    assert (
        busy.value.status == 503
        and busy.value.to_api_error(1).message == "served entity entity: the upstream answered HTTP 503"
    )
    too_many = limited.value.to_api_error(1)  # a rate-limited upstream: fallback-able, else the client's 429
    assert limited.value.status == 429 and too_many.status_code == 429 and too_many.headers == {"Retry-After": "7"}
    assert (
        refused.value.to_api_error(1).status_code == 502
        and "could not be reached" in refused.value.to_api_error(1).message
    )
    assert quiet.value.timed_out and quiet.value.to_api_error(1).status_code == 504
    return [dropped.value, busy.value, limited.value, refused.value, quiet.value]
