"""The hop from the gateway to whatever answers a chat request: a replica of a chat model, or an external
model's OpenAI-compatible server. One aiohttp session for both (keep-alive, no overall timeout: a stream
lasts as long as its answer; the wait for the first byte and between two bytes is bounded instead).

``open_chat`` returns the upstream's response once its status says it will answer; a connection that
fails, a 5xx, a 429 or no first byte in time is ``UpstreamFailed``, which the chat plane may hand to a
fallback entity. Nothing here reads a secret or logs a body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp

from serving.protocol.errors import ApiError
from serving.protocol.wire import POOL_KEEP_ALIVE_S


@dataclass(frozen=True)
class Target:
    """Where one attempt goes: the URL of a chat-completions route and the headers it needs."""

    entity: str  # the served entity's name (what errors name; never the key)
    url: str
    headers: Mapping[str, str]
    external: bool  # an external model: its error bodies are not ours to pass on


class UpstreamFailed(Exception):
    """The upstream did not take the request: unreachable, 5xx, 429 or silent. ``status`` is its HTTP status
    (None when there was none); ``retry_after`` is its Retry-After, if it sent one."""

    def __init__(
        self,
        target: Target,
        reason: str,
        status: int | None = None,
        retry_after: str | None = None,
        timed_out: bool = False,
    ) -> None:
        super().__init__(reason)
        self.target = target
        self.reason = reason
        self.status = status
        self.retry_after = retry_after
        self.timed_out = timed_out

    def to_api_error(self, timeout_s: float) -> ApiError:
        """What the client gets when no fallback serves it: names the entity and the upstream's status."""
        who = f"served entity {self.target.entity}"
        if self.timed_out:
            return ApiError(504, "DEADLINE_EXCEEDED", f"{who}: the upstream did not answer within {timeout_s:.0f}s")
        if self.status == 429:
            headers = (
                {"Retry-After": self.retry_after}
                if self.retry_after and self.retry_after.isdigit()
                else {"Retry-After": "1"}
            )
            return ApiError(
                429, "REQUEST_LIMIT_EXCEEDED", f"{who}: the upstream is over its rate limit (HTTP 429)", headers
            )
        if self.status is not None:
            return ApiError(502, "BAD_GATEWAY", f"{who}: the upstream answered HTTP {self.status}")
        return ApiError(502, "BAD_GATEWAY", f"{who}: the upstream could not be reached ({self.reason})")


class UpstreamRefused(Exception):
    """The upstream answered 4xx (not 429): the request itself is wrong, no fallback would take it."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class Upstreams:
    def __init__(self, *, connect_timeout_s: float = 5.0, idle_timeout_s: float = 30.0) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=POOL_KEEP_ALIVE_S, enable_cleanup_closed=True)
        self._session = aiohttp.ClientSession(
            connector=connector,
            skip_auto_headers=("User-Agent",),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=self.connect_timeout_s, sock_read=self.idle_timeout_s
            ),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open_chat(self, target: Target, body: bytes) -> aiohttp.ClientResponse:
        """The upstream's response, status 200, body not yet read (the caller reads or streams it and then
        releases it); UpstreamFailed or UpstreamRefused otherwise."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        headers = {
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            **target.headers,
        }
        for attempt in (1, 2):
            try:
                response = await self._session.post(target.url, data=body, headers=headers)
                break
            except TimeoutError:
                raise UpstreamFailed(target, "timeout", timed_out=True) from None
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
                # a pooled connection the server closed (or reset) as it went idle, before any answer: once more, on a
                # new connection; a connection that could not be made at all is not retried
                if attempt == 2 or isinstance(exc, aiohttp.ClientConnectorError):
                    raise UpstreamFailed(target, type(exc).__name__) from None
            except (aiohttp.ClientError, OSError) as exc:
                raise UpstreamFailed(target, type(exc).__name__) from None
        if response.status == 200:
            return response
        try:
            error_body = await response.read() if not target.external else b""
        except (TimeoutError, aiohttp.ClientError, OSError):
            error_body = b""
        finally:
            response.release()
        if response.status >= 500 or response.status == 429:
            raise UpstreamFailed(
                target, f"HTTP {response.status}", response.status, response.headers.get("Retry-After")
            )
        raise UpstreamRefused(response.status, error_body)


async def read_whole(target: Target, response: aiohttp.ClientResponse) -> bytes:
    """A non-streamed answer's body; UpstreamFailed if the upstream goes quiet or away first."""
    try:
        return await response.read()
    except TimeoutError:
        raise UpstreamFailed(target, "timeout", timed_out=True) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailed(target, type(exc).__name__) from None
    finally:
        response.release()


async def chunks(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """A streamed answer's bytes as they arrive (the caller handles the errors: the stream has begun)."""
    async for chunk in response.content.iter_any():
        yield chunk
