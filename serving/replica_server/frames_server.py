"""The replica's end of the framed hop (``serving.protocol.frames``): a Unix socket beside its HTTP port, on
which its gateway sends batch envelopes without HTTP.

A connection must open with a hello carrying the replica token (any hello, when the replica has none, as its
HTTP routes then take any caller); then each call frame is scored as ``POST /invocations/batch`` would score it
(``ReplicaApp.score_threaded``, on the predict thread, so the event loop keeps answering probes) and answered
with the busy clock. A malformed envelope is answered ``FAILED`` with what is wrong; a stream that is not
frames, or a call before the hello, closes the connection. When the replica stops (``ReplicaServer``, in
``__main__``, calls ``FrameListener.close`` first), it takes no new connection or call, lets the calls in flight
finish, and closes the connections, as uvicorn does with its requests.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from typing import Any, cast

from serving.protocol import frames, wire

log = logging.getLogger(__name__)


class FrameServer(asyncio.Protocol):
    """One gateway connection. ``target()`` is the app that scores (None: no model loaded yet, a standby)."""

    def __init__(self, target: Callable[[], Any], token: str | None) -> None:
        self._target = target
        self._token = (token or "").encode()
        self._reader = frames.FrameReader(frames.MAX_HELLO)
        self._greeted = False
        self.stopping = False
        self._transport: asyncio.Transport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection's transport writes (uvloop's is no subclass of asyncio.Transport: no isinstance)
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    @property
    def connected(self) -> bool:
        return self._transport is not None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    @property
    def in_flight(self) -> set[asyncio.Task[None]]:
        """The calls being scored on the predict thread."""
        return set(self._tasks)

    def data_received(self, data: bytes) -> None:
        while True:
            try:
                received = self._reader.feed(data)
            except frames.FrameError as exc:
                self._refuse(str(exc))
                return
            for frame in received:
                if not self._greeted:
                    if frame.kind != frames.HELLO or (
                        self._token and not hmac.compare_digest(frame.payload, self._token)
                    ):
                        self._refuse("a hello with the replica token must come first")
                        return
                    self._greeted = True
                    self._reader.max_payload = frames.MAX_CALL
                elif frame.kind != frames.CALL:
                    self._refuse(f"frame kind {frame.kind} is not a call")
                    return
                else:
                    self._call(frame.call_id, frame.payload)
            if not received or received[-1].kind != frames.HELLO:
                return
            data = b""  # the reader stops after a hello: read on, with the limit for calls

    def _call(self, call_id: int, envelope: bytes) -> None:
        app = self._target()
        if self.stopping:
            self._write(frames.frame(frames.FAILED, call_id, b"the replica is stopping"))
        elif app is None or not hasattr(app, "score_threaded"):
            self._write(frames.frame(frames.FAILED, call_id, b"this replica has no scoring model loaded"))
        else:
            task = asyncio.get_running_loop().create_task(self._threaded(app, call_id, envelope))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _threaded(self, app: Any, call_id: int, envelope: bytes) -> None:
        try:
            out: bytes | Exception = await app.score_threaded(envelope)
        except Exception as exc:
            out = exc
        self._write(self._answer(app, call_id, lambda: _raise_or_return(out)))

    @staticmethod
    def _answer(app: Any, call_id: int, score: Callable[[], bytes]) -> bytes:
        try:
            envelope = score()
        except wire.WireError as exc:
            return frames.frame(frames.FAILED, call_id, str(exc).encode())
        except Exception:
            log.exception("scoring a framed call failed")
            return frames.frame(frames.FAILED, call_id, b"internal error in the replica; see its log")
        return frames.frame(frames.ANSWER, call_id, frames.answer_payload(app.metrics.busy.total(), envelope))

    def _write(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _refuse(self, reason: str) -> None:
        log.warning("closing a frame connection: %s", reason)
        self._write(frames.frame(frames.FAILED, 0, reason.encode()))
        if self._transport is not None:
            self._transport.close()


def _raise_or_return(out: bytes | Exception) -> bytes:
    if isinstance(out, Exception):
        raise out
    return out


class FrameListener:
    """The frame socket's server and its connections' calls in flight."""

    def __init__(self, target: Callable[[], Any], token: str | None) -> None:
        self._target = target
        self._token = token
        self._connections: list[FrameServer] = []
        self._server: asyncio.AbstractServer | None = None

    async def start(self, address: str) -> None:
        """Listen on ``address`` (``unix:@NAME``)."""
        self._server = await asyncio.get_running_loop().create_unix_server(self._connection, frames.unix_path(address))

    def _connection(self) -> FrameServer:
        self._connections = [c for c in self._connections if c.connected]
        connection = FrameServer(self._target, self._token)
        self._connections.append(connection)
        return connection

    async def close(self, grace_s: float) -> None:
        """No new connections, new calls answered FAILED (the gateway retries them on another replica), the calls
        in flight answered (for at most ``grace_s``), then the connections closed; as uvicorn stops its requests."""
        if self._server is not None:
            self._server.close()
        for connection in self._connections:
            connection.stopping = True
        pending = [task for c in self._connections for task in c.in_flight]
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
        for connection in self._connections:
            connection.close()
