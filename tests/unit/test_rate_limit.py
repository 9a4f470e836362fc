"""Per-token rate limits: the token bucket, stepped by passing ``now``."""

from __future__ import annotations

import pytest

from serving.gateway.rate_limit import RateLimit, TokenBuckets
from serving.protocol.errors import ApiError

LIMIT = RateLimit(requests_per_second=2.0, burst=3.0)


def test_a_full_bucket_admits_its_burst_then_says_when_the_next_request_passes():
    buckets = TokenBuckets()
    assert [buckets.take("app", LIMIT, now=10.0) for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("app", LIMIT, now=10.0) == pytest.approx(0.5)  # one token refills in 1/2 s
    assert buckets.take("app", LIMIT, now=10.5) == 0.0
    assert buckets.take("app", LIMIT, now=10.5) > 0


def test_the_bucket_refills_at_the_rate_and_never_past_the_burst():
    buckets = TokenBuckets()
    for _ in range(3):
        buckets.take("app", LIMIT, now=0.0)
    admitted = sum(buckets.take("app", LIMIT, now=100.0) == 0.0 for _ in range(10))
    assert admitted == 3


def test_principals_have_their_own_buckets():
    buckets = TokenBuckets()
    for _ in range(3):
        buckets.take("a", LIMIT, now=0.0)
    assert buckets.take("a", LIMIT, now=0.0) > 0
    assert buckets.take("b", LIMIT, now=0.0) == 0.0


def test_over_the_limit_is_a_429_with_a_whole_retry_after_of_at_least_one_second():
    clock = iter([0.0, 0.0, 0.0, 0.0])
    buckets = TokenBuckets(clock=lambda: next(clock))
    for _ in range(3):
        buckets.admit("app", LIMIT)
    with pytest.raises(ApiError) as caught:
        buckets.admit("app", LIMIT)
    assert caught.value.status_code == 429 and caught.value.error_code == "REQUEST_LIMIT_EXCEEDED"
    assert caught.value.headers == {"Retry-After": "1"}


def test_a_slow_limit_asks_for_a_longer_wait():
    slow = RateLimit(requests_per_second=0.1, burst=1.0)
    buckets = TokenBuckets(clock=lambda: 0.0)
    buckets.admit("app", slow)
    with pytest.raises(ApiError) as caught:
        buckets.admit("app", slow)
    assert caught.value.headers == {"Retry-After": "10"}


def test_no_limit_admits_everything():
    buckets = TokenBuckets(clock=lambda: 0.0)
    admitted = 0
    for _ in range(1000):
        buckets.admit("admin", None)  # raises ApiError (429) when refused
        admitted += 1
    assert admitted == 1000


@pytest.mark.parametrize(
    "value, ok",
    [
        ({"requests_per_second": 5}, RateLimit(5.0, 5.0)),
        ({"requests_per_second": 0.5}, RateLimit(0.5, 1.0)),
        ({"requests_per_second": 5, "burst": 20}, RateLimit(5.0, 20.0)),
    ],
)
def test_parse_fills_the_burst_from_the_rate(value, ok):
    assert RateLimit.parse(value, "here") == ok


@pytest.mark.parametrize(
    "value",
    [
        {"requests_per_second": True},
        {"requests_per_second": float("inf")},
        {},
        [],
        {"requests_per_second": 1, "burst": -1},
    ],
)
def test_parse_refuses_nonsense_naming_where(value):
    with pytest.raises(ValueError, match=r"^here"):
        RateLimit.parse(value, "here")
