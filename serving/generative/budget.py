"""Per-minute call and token budgets of the AI gateway's rate limits, as token buckets.

Each applicable rule is a bucket holding up to its per-minute limit, refilling limit/60 per second and
starting full. A request takes 1 from every applicable ``calls`` bucket and its token estimate (prompt
estimate + max_tokens) from every applicable ``tokens`` bucket, all or nothing; once the response is
known, ``settle`` refunds the tokens not used or charges the extra, so a bucket may go negative and
later requests wait. The estimate is charged up front because a streamed response's size is not known
until it ends, and concurrent requests must not all pass on the same budget.

Buckets are keyed by endpoint, rule (including its limit: a changed limit starts a fresh, full bucket)
and, for per-user rules, token name. A full bucket is the same as a missing one, so buckets full and
idle for 10 minutes are dropped once there are more than 10,000. The clock is injected; tests pass
``now``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from serving.generative.ai_gateway import RateLimitRule
from serving.protocol.errors import ApiError, invalid_parameter

MAX_BUCKETS = 10_000
IDLE_SECONDS = 600.0
_PRUNE_EVERY = 60.0
_EPSILON = 1e-9  # float slack: a bucket refilled to 0.9999999999 has room for 1
_MAX_NAME = 100
_WHO = {"endpoint": "endpoint", "user": "per-user", "service_principal": "per-service-principal"}


@dataclass(frozen=True)
class Reservation:
    """What ``reserve`` took from the token buckets, for ``settle`` to correct."""

    entries: tuple[tuple[str, int], ...]  # (bucket key, tokens reserved) for each token bucket charged
    tokens: int


@dataclass
class _Bucket:
    level: float
    at: float
    capacity: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + max(0.0, now - self.at) * self.capacity / 60.0)
        self.at = max(self.at, now)


@dataclass(frozen=True)
class _Charge:
    key: str
    rule: RateLimitRule
    kind: str  # "calls" | "tokens"
    limit: int
    amount: int


def _describe(rule: RateLimitRule, kind: str, limit: int) -> str:
    unit = kind if limit != 1 else kind[:-1]
    return f"{_WHO.get(rule.key, rule.key)} limit of {limit} {unit} per minute"


def _applies(rule: RateLimitRule, principal: str) -> bool:
    if rule.key == "endpoint":
        return True
    if rule.key in ("user", "service_principal"):
        return rule.principal is None or rule.principal == principal
    return False


def _charges(endpoint: str, principal: str, rules: Sequence[RateLimitRule], tokens: int) -> list[_Charge]:
    out: dict[str, _Charge] = {}  # keyed by bucket: a rule given twice is one limit, charged once
    for rule in rules:
        if not _applies(rule, principal):
            continue
        subject = None if rule.key == "endpoint" else principal
        for kind, limit, amount in (("calls", rule.calls, 1), ("tokens", rule.tokens, tokens)):
            if limit is not None:
                key = repr((endpoint, rule.key, rule.principal, subject, kind, limit))
                out.setdefault(key, _Charge(key, rule, kind, limit, amount))
    return list(out.values())


class UsageBudgets:
    """Every endpoint's rate-limit buckets; one lock makes ``reserve`` and ``settle`` thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()
        self._last_prune = -math.inf

    def reserve(
        self, endpoint: str, principal: str, rules: Sequence[RateLimitRule], tokens: int, now: float | None = None
    ) -> Reservation:
        """Take one call and ``tokens`` from every applicable bucket, or nothing.

        A 400 when ``tokens`` exceeds a tokens rule's whole per-minute limit (it could never pass);
        a 429 with Retry-After (whole seconds, at least 1) when a bucket lacks room now.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise ValueError("tokens must be a non-negative integer")
        charges = _charges(endpoint, principal, rules, tokens)
        for charge in charges:
            if charge.amount > charge.limit:
                raise invalid_parameter(
                    f"this request may use up to {tokens} tokens (prompt estimate + max_tokens), more than the "
                    f"{_describe(charge.rule, charge.kind, charge.limit)}: lower max_tokens"
                )
        now = self._clock() if now is None else now
        with self._lock:
            buckets = [self._bucket(charge, now) for charge in charges]
            short = [
                (charge, (charge.amount - bucket.level) * 60.0 / charge.limit)
                for charge, bucket in zip(charges, buckets)
                if bucket.level + _EPSILON < charge.amount
            ]
            if short:
                raise _too_many(principal, short)
            for charge, bucket in zip(charges, buckets):
                bucket.level -= charge.amount
                self._buckets[charge.key] = bucket
            self._prune(now)
        entries = tuple((c.key, c.amount) for c in charges if c.kind == "tokens")
        return Reservation(entries=entries, tokens=tokens)

    def settle(self, reservation: Reservation, used_tokens: int, now: float | None = None) -> None:
        """Correct each charged token bucket by (reserved - used): refund up to its capacity, or charge more."""
        if isinstance(used_tokens, bool) or not isinstance(used_tokens, int) or used_tokens < 0:
            raise ValueError("used_tokens must be a non-negative integer")
        now = self._clock() if now is None else now
        with self._lock:
            for key, reserved in reservation.entries:
                bucket = self._buckets.get(key)
                if bucket is None:  # dropped while full and idle: nothing to correct
                    continue
                bucket.refill(now)
                bucket.level = min(bucket.capacity, bucket.level + reserved - used_tokens)

    def _bucket(self, charge: _Charge, now: float) -> _Bucket:
        """The charge's bucket refilled to ``now``: a fresh, full one (not stored yet) if it has none."""
        bucket = self._buckets.get(charge.key)
        if bucket is None:
            return _Bucket(level=float(charge.limit), at=now, capacity=float(charge.limit))
        bucket.refill(now)
        return bucket

    def _prune(self, now: float) -> None:
        """Past MAX_BUCKETS, drop buckets full and idle for IDLE_SECONDS (at most once a minute)."""
        if len(self._buckets) <= MAX_BUCKETS or now - self._last_prune < _PRUNE_EVERY:
            return
        self._last_prune = now
        for key, bucket in list(self._buckets.items()):
            if now - bucket.at > IDLE_SECONDS:
                bucket.refill(now)
                if bucket.level >= bucket.capacity:
                    del self._buckets[key]

    def __len__(self) -> int:
        with self._lock:
            return len(self._buckets)


def _too_many(principal: str, short: list[tuple[_Charge, float]]) -> ApiError:
    """The 429 for the refusing buckets: Retry-After is when all of them would have room."""
    seconds = max(1, math.ceil(max(wait for _, wait in short) - _EPSILON))
    charge = max(short, key=lambda item: item[1])[0]
    return ApiError(
        429,
        "REQUEST_LIMIT_EXCEEDED",
        f"{_describe(charge.rule, charge.kind, charge.limit)} reached for token {principal[:_MAX_NAME]!r}; "
        f"retry in {seconds}s",
        headers={"Retry-After": str(seconds)},
    )
