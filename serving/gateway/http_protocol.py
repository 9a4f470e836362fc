"""uvicorn's httptools protocol, with each response's status line and headers sent with its body in one write.

uvicorn writes an ASGI response's start (status line and headers) and its body as two writes to the transport,
and uvloop sends each at once: a small answer costs two ``send`` calls and wakes its client twice. Here the
transport keeps what a connection writes during one turn of the event loop and sends it as one write at the
end of that turn (a call_soon), or at once when the connection closes. A streamed answer (server-sent events)
leaves as it is written: what one turn writes goes out together at its end, never later. Flow control is
uvicorn's: the transport pauses the writer once a flush finds its buffer full (one turn later than uvicorn
alone, which checks on each write).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class _OneWritePerTurn:
    """The parts of ``asyncio.Transport`` uvicorn uses, with writes gathered per turn of the loop."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(data)

    def _flush(self) -> None:
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # get_extra_info, is_closing, pause_reading, ...
        return getattr(self._transport, name)


class OneWriteHttpTools(HttpToolsProtocol):
    """Pass as uvicorn's ``http``."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's own
        # _OneWritePerTurn is not an asyncio.Transport: it has the parts uvicorn calls and delegates the rest
        super().connection_made(_OneWritePerTurn(transport, self.loop))  # type: ignore[arg-type]  # duck-typed
