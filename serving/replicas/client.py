"""The gateway's client for its replicas: one keep-alive aiohttp session, batch envelopes out and in.

aiohttp rather than httpx on this hop: at thousands of calls a second the client's own per-request
work is the gateway's largest cost after the server side, and aiohttp's is a fraction of httpx's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from serving.protocol import wire


class ReplicaClient:
    def __init__(self, token: str | None = None, connect_timeout_s: float = 5.0) -> None:
        self._headers = {"content-type": wire.CONTENT_TYPE}
        if token:
            self._headers["authorization"] = f"Bearer {token}"
        self._connect_timeout_s = connect_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=wire.POOL_KEEP_ALIVE_S, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector, skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout_s),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, replica: Any, requests: list[wire.WireRequest]) -> wire.WireReply:
        """The replica's answers, one per request, in order, with its busy clock; ReplicaUnreachable if
        there are none."""
        assert self._session is not None, "ReplicaClient.start() first"
        try:
            async with self._session.post(replica.url + wire.PATH, data=wire.encode_requests(requests),
                                          headers=self._headers) as response:
                body = await response.read()
                status = response.status
                busy = response.headers.get(wire.BUSY_HEADER)
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            raise wire.ReplicaUnreachable(type(exc).__name__) from exc
        if status != 200:
            raise wire.ReplicaUnreachable(f"replica answered HTTP {status} to a batch")
        try:
            answers = wire.decode_answers(body, len(requests))
        except wire.WireError as exc:
            raise wire.ReplicaUnreachable(str(exc)) from exc
        return wire.WireReply(answers, wire.busy_reading(busy))
