"""Per-token rate limits: one token bucket per principal, 429 with Retry-After past it.

A bucket holds up to ``burst`` requests and refills at ``requests_per_second``; a request takes one.
An empty bucket refuses at once and says when the next request would pass (rounded up to whole
seconds, at least 1, as Retry-After carries). Limits come from the tokens file
(``"rate_limit": {"requests_per_second": 50, "burst": 100}`` on an entry); a principal without one
is not limited. The clock is injected, so tests step time by passing ``now``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from serving.protocol.errors import ApiError

_KEYS = frozenset({"requests_per_second", "burst"})


@dataclass(frozen=True)
class RateLimit:
    requests_per_second: float
    burst: float

    @classmethod
    def parse(cls, value: Any, where: str) -> RateLimit:
        """From a tokens-file entry's ``rate_limit`` object; ValueError naming ``where`` otherwise."""
        if not isinstance(value, Mapping):
            raise ValueError(f"{where}: 'rate_limit' must be an object with requests_per_second and optional burst")
        unknown = sorted(str(k)[:64] for k in value if k not in _KEYS)
        if unknown:
            raise ValueError(
                f"{where}: 'rate_limit' has unknown key(s) {unknown}; accepted: requests_per_second, burst"
            )
        rate, burst = value.get("requests_per_second"), value.get("burst")
        if not _positive(rate):
            raise ValueError(f"{where}: 'rate_limit.requests_per_second' must be a positive number")
        if burst is None:
            burst = max(1.0, float(rate))
        if not _positive(burst) or burst < 1:
            raise ValueError(f"{where}: 'rate_limit.burst' must be a number >= 1")
        return cls(float(rate), float(burst))


def _positive(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


class TokenBuckets:
    """The buckets of every limited principal, keyed by principal name; safe across threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)
        self._lock = threading.Lock()

    def take(self, name: str, limit: RateLimit, now: float | None = None) -> float:
        """Take one request from ``name``'s bucket: 0.0 if admitted, else the seconds until one would pass."""
        now = self._clock() if now is None else now
        with self._lock:
            tokens, at = self._buckets.get(name, (limit.burst, now))
            tokens = min(limit.burst, tokens + max(0.0, now - at) * limit.requests_per_second)
            if tokens >= 1.0:
                self._buckets[name] = (tokens - 1.0, now)
                return 0.0
            self._buckets[name] = (tokens, now)
            return (1.0 - tokens) / limit.requests_per_second

    def admit(self, name: str, limit: RateLimit | None) -> None:
        """Raise a 429 with Retry-After when ``name`` is over its limit; nothing for unlimited principals."""
        if limit is None:
            return
        wait = self.take(name, limit)
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            raise ApiError(
                429,
                "REQUEST_LIMIT_EXCEEDED",
                f"token {name[:100]!r} is over its rate limit of {limit.requests_per_second:g} requests/s; "
                f"retry in {retry_after}s",
                headers={"Retry-After": str(retry_after)},
            )
