"""The gateway's client for its replicas: batch envelopes out and in, in frames on a Unix socket where the
replica offers one (``serving.protocol.frames``), else over HTTP on one keep-alive aiohttp session.

The first envelope to a replica goes over HTTP; a replica on this machine (a loopback address) names its frame
socket in that answer, and later envelopes go there. A frame socket that cannot be reached is not tried again (that
replica is served over HTTP); a connection that closes is forgotten, and the next envelope goes over HTTP,
whose answer names the socket again if the replica is still there. aiohttp rather than httpx for HTTP: at
thousands of calls a second the client's own per-request work is the gateway's largest cost after the server
side, and aiohttp's is a fraction of httpx's.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlsplit

import aiohttp

from serving.protocol import frames, wire
from serving.replicas.frames_client import FrameConnection, connect
from serving.traffic.replica import Replica

log = logging.getLogger(__name__)

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


class ReplicaClient:
    def __init__(self, token: str | None = None, connect_timeout_s: float = 5.0) -> None:
        self._token = token
        self._headers = {"content-type": wire.CONTENT_TYPE}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._addresses: dict[str, str] = {}  # replica URL -> the frame socket it named
        self._connections: dict[str, FrameConnection] = {}
        self._connecting: dict[str, asyncio.Future[FrameConnection | None]] = {}  # connects under way
        self._unreachable: set[str] = set()  # frame sockets that could not be reached: HTTP for good

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=wire.POOL_KEEP_ALIVE_S, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
        )

    async def close(self) -> None:
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, replica: Replica, requests: list[wire.WireRequest]) -> wire.WireReply:
        """The replica's answers, one per request, in order, with its busy clock; ReplicaUnreachable if
        there are none."""
        envelope = wire.encode_requests(requests)
        connection = await self._frames(replica.url) if len(envelope) <= frames.MAX_CALL else None
        busy: float | None
        if connection is not None:
            busy, body = await connection.call(envelope)
        else:
            body, busy = await self._post(replica.url, envelope)
        try:
            answers = wire.decode_answers(body, len(requests))
        except wire.WireError as exc:
            raise wire.ReplicaUnreachable(str(exc)) from exc
        return wire.WireReply(answers, busy)

    async def _post(self, url: str, envelope: bytes) -> tuple[bytes, float | None]:
        assert self._session is not None, "ReplicaClient.start() first"
        try:
            async with self._session.post(url + wire.PATH, data=envelope, headers=self._headers) as response:
                body = await response.read()
                status = response.status
                busy = response.headers.get(wire.BUSY_HEADER)
                address = response.headers.get(frames.ADDRESS_HEADER)
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            raise wire.ReplicaUnreachable(type(exc).__name__) from exc
        if status != 200:
            raise wire.ReplicaUnreachable(f"replica answered HTTP {status} to a batch")
        if address is not None and address not in self._unreachable and urlsplit(url).hostname in LOOPBACK:
            self._addresses[url] = address
        return body, wire.busy_reading(busy)

    async def _frames(self, url: str) -> FrameConnection | None:
        """The open frame connection to the replica at ``url``, connecting if it named a socket; None: HTTP."""
        connection = self._connections.get(url)
        if connection is not None and connection.open:
            return connection
        address = self._addresses.get(url)
        if address is None:
            return None
        attempt = self._connecting.get(url)
        if attempt is None:  # one connection attempt, however many calls wait for it (and if they are cancelled)
            attempt = asyncio.ensure_future(self._connect(url, address))
            self._connecting[url] = attempt
            attempt.add_done_callback(lambda _: self._connecting.pop(url, None))
        return await asyncio.shield(attempt)

    async def _connect(self, url: str, address: str) -> FrameConnection | None:
        try:
            connection = await connect(address, self._token, self._connect_timeout_s, lambda c: self._lost(url, c))
        except (TimeoutError, OSError, frames.FrameError) as exc:
            log.info(
                "replica %s: its frame socket %s cannot be reached (%s): HTTP instead", url, address, type(exc).__name__
            )
            self._addresses.pop(url, None)
            self._connections.pop(url, None)
            if len(self._unreachable) < 10_000:  # each address names one replica process (its pid and port)
                self._unreachable.add(address)
            return None
        if self._session is None:  # the client was closed while this connected
            connection.close()
            return None
        self._connections[url] = connection
        return connection

    def _lost(self, url: str, connection: FrameConnection) -> None:
        """A frame connection closed (its replica stopped, or refused it): the next envelope goes over HTTP,
        whose answer names the socket again if the replica is still there. A connection that closed late,
        after another replaced it, takes nothing with it."""
        if self._connections.get(url) is connection:
            del self._connections[url]
            self._addresses.pop(url, None)
