"""A load generator for the gateway's data plane, shared by the fault, overload and soak runs.

Two shapes: closed loop (``concurrency`` workers, each sending its next request when the last one is
answered) and open loop (``rate`` requests per second whatever the answers, at most ``max_outstanding``
in flight). Every request carries its own ``x-request-id`` and its outcome is kept: status, latency,
Retry-After, or the client-side error (a timeout past ``timeout_s`` is a hang). Only loopback.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass(frozen=True)
class Outcome:
    request_id: str
    started: float  # monotonic
    latency_s: float
    status: int | None  # None: no HTTP answer (see error)
    retry_after: str | None = None
    error: str | None = None
    reason: str | None = None  # an error answer's message, its numbers as N (so that answers alike group together)


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    duration_s: float = 0.0
    skipped: int = 0  # open loop: requests not sent because max_outstanding were already in flight

    def statuses(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.outcomes:
            key = str(o.status) if o.status is not None else f"error:{o.error}"
            counts[key] = counts.get(key, 0) + 1
        return dict(sorted(counts.items()))

    def with_status(self, status: int) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    def rate(self, status: int = 200) -> float:
        return len(self.with_status(status)) / self.duration_s if self.duration_s else 0.0

    def percentile(self, q: float, status: int = 200) -> float:
        """The q-th percentile (0-100) latency in seconds of the answers with ``status``."""
        values = sorted(o.latency_s for o in self.with_status(status))
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]

    def summary(self) -> str:
        ok = self.with_status(200)
        return (
            f"{len(self.outcomes)} requests in {self.duration_s:.1f}s: {self.statuses()}; "
            f"200s at {self.rate():.0f}/s, p50 {self.percentile(50) * 1000:.1f} ms, "
            f"p99 {self.percentile(99) * 1000:.1f} ms, max {max((o.latency_s for o in ok), default=0) * 1000:.0f} ms"
        )


def _reason(content: bytes) -> str:
    """An error answer's ``message`` (the API's error shape), its numbers as N; its first 80 bytes otherwise."""
    try:
        message = str(json.loads(content).get("message", ""))
    except (ValueError, AttributeError):
        message = content[:80].decode(errors="replace")
    return re.sub(r"\d+(\.\d+)?", "N", message)[:120]


async def _one(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: bytes, timeout_s: float
) -> Outcome:
    request_id = secrets.token_hex(8)
    started = time.monotonic()
    try:
        async with session.post(
            url,
            data=body,
            headers={**headers, "x-request-id": request_id},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as reply:
            content = await reply.read()
            return Outcome(
                request_id,
                started,
                time.monotonic() - started,
                reply.status,
                reply.headers.get("Retry-After"),
                reason=None if reply.status == 200 else _reason(content),
            )
    except TimeoutError:
        return Outcome(request_id, started, time.monotonic() - started, None, error="timeout")
    except aiohttp.ClientError as exc:
        return Outcome(request_id, started, time.monotonic() - started, None, error=type(exc).__name__)


async def run_load(
    url: str,
    token: str,
    body: bytes,
    duration_s: float,
    *,
    concurrency: int = 8,
    rate: float | None = None,
    max_outstanding: int = 2000,
    timeout_s: float = 40.0,
    stop: asyncio.Event | None = None,
) -> LoadResult:
    """Send ``body`` to ``url`` for ``duration_s``: closed loop with ``concurrency`` workers, or open loop at
    ``rate``."""
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    result = LoadResult()
    connector = aiohttp.TCPConnector(limit=max_outstanding if rate else concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.monotonic()
        deadline = began + duration_s

        def over() -> bool:
            return time.monotonic() >= deadline or (stop is not None and stop.is_set())

        if rate is None:

            async def worker() -> None:
                while not over():
                    result.outcomes.append(await _one(session, url, headers, body, timeout_s))

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            tasks: set[asyncio.Task[Outcome]] = set()
            sent = 0
            while not over():
                due = int((time.monotonic() - began) * rate) - sent
                for _ in range(max(0, due)):
                    sent += 1
                    if len(tasks) >= max_outstanding:
                        result.skipped += 1  # the generator's own bound: counted, not sent late in a burst
                        continue
                    task = asyncio.ensure_future(_one(session, url, headers, body, timeout_s))
                    task.add_done_callback(lambda t: (tasks.discard(t), result.outcomes.append(t.result())))
                    tasks.add(task)
                await asyncio.sleep(0.002)
            if tasks:
                await asyncio.gather(*tasks)
        result.duration_s = time.monotonic() - began
    return result
