"""The gateway's HTTP protocol sends what a connection writes in one turn of the loop as one write, and what
is written before a close is sent before it."""

from __future__ import annotations

import asyncio

from serving.gateway.http_protocol import _OneWritePerTurn


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_a_response_start_and_body_leave_as_one_write_and_a_close_sends_what_is_pending_first():
    async def scenario() -> _Transport:
        real = _Transport()
        transport = _OneWritePerTurn(real, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        transport.write(b"{}")
        assert real.writes == [], "nothing leaves before the turn ends"
        await asyncio.sleep(0)
        assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        transport.write(b"data: 1\n\n")  # a stream's chunk, in a turn of its own
        await asyncio.sleep(0)
        transport.write(b"data: 2\n\n")
        await asyncio.sleep(0)
        assert real.writes[1:] == [b"data: 1\n\n", b"data: 2\n\n"]
        transport.write(b"last")
        transport.close()
        assert real.writes[-1] == b"last" and real.closed
        await asyncio.sleep(0)  # the flush still scheduled finds nothing left
        assert transport.get_extra_info("peername") == "info:peername" and transport.is_closing()
        return real

    assert len(asyncio.run(scenario()).writes) == 4
