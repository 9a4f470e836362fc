"""The gateway's end of the framed hop (``serving.protocol.frames``): one Unix socket connection per replica,
several calls in flight on it, each answer matched to its call by id.

A connection opens with the hello (the replica token). When it closes, every call still waiting on it fails
with ``ReplicaUnreachable``, as an HTTP call to a replica that went away does, and the dispatcher retries
those once on another replica.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import cast

from serving.protocol import frames
from serving.protocol.wire import ReplicaUnreachable


class FrameConnection(asyncio.Protocol):
    def __init__(self, token: str | None, on_lost: Callable[[FrameConnection], None]) -> None:
        self._on_lost = on_lost
        self._hello = frames.frame(frames.HELLO, 0, (token or "").encode())
        self._reader = frames.FrameReader(frames.MAX_ANSWER)
        self._waiting: dict[int, asyncio.Future[frames.Frame]] = {}
        self._last_id = 0
        self._transport: asyncio.Transport | None = None

    # ---- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream connection's transport writes (uvloop's is no subclass of asyncio.Transport: no isinstance)
        self._transport = cast(asyncio.Transport, transport)
        self._transport.write(self._hello)

    def data_received(self, data: bytes) -> None:
        try:
            received = self._reader.feed(data)
        except frames.FrameError as exc:
            self._fail_all(str(exc))
            return
        for frame in received:
            if frame.call_id == 0:  # the replica refused the connection: it closes it
                self._fail_all(
                    f"replica refused the frame connection: {frame.payload[:200].decode('utf-8', 'replace')}"
                )
                return
            waiter = self._waiting.pop(frame.call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._fail_all("the replica closed the frame connection")
        self._on_lost(self)

    # ---- calls ---------------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def call(self, envelope: bytes) -> tuple[float, bytes]:
        """The replica's busy clock and answer envelope for a request envelope; ReplicaUnreachable if the
        connection fails first or the replica could not answer the call."""
        if not self.open:
            raise ReplicaUnreachable("frame connection closed")
        self._last_id = call_id = self._last_id % 0xFFFFFFFF + 1  # 1 .. 2**32-1: id 0 is the connection's own
        waiter: asyncio.Future[frames.Frame] = asyncio.get_running_loop().create_future()
        self._waiting[call_id] = waiter
        transport = self._transport
        assert transport is not None, "checked open above, on this same loop turn"
        transport.write(frames.frame(frames.CALL, call_id, envelope))
        try:
            frame = await waiter
        finally:
            self._waiting.pop(call_id, None)  # cancelled (the dispatcher's timeout): a late answer is dropped
        if frame.kind != frames.ANSWER:
            raise ReplicaUnreachable(f"replica could not answer: {frame.payload[:200].decode('utf-8', 'replace')}")
        try:
            return frames.split_answer(frame.payload)
        except frames.FrameError as exc:
            raise ReplicaUnreachable(str(exc)) from None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _fail_all(self, reason: str) -> None:
        waiting, self._waiting = self._waiting, {}
        for waiter in waiting.values():
            if not waiter.done():
                waiter.set_exception(ReplicaUnreachable(reason))
        if self._transport is not None:
            self._transport.close()


async def connect(
    address: str, token: str | None, timeout_s: float, on_lost: Callable[[FrameConnection], None]
) -> FrameConnection:
    """A connection to the replica's frame socket (its hello sent), which calls ``on_lost(itself)`` when it closes;
    OSError, TimeoutError or FrameError (not a frame address) if none. The socket is connected here and handed
    to the loop: uvloop's ``create_unix_connection`` cannot connect to an abstract name itself (EINVAL)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, frames.unix_path(address)), timeout_s)
        _, connection = await loop.create_unix_connection(lambda: FrameConnection(token, on_lost), sock=sock)
    except BaseException:
        sock.close()
        raise
    return connection
