"""Per-minute call and token budgets: token buckets stepped by passing ``now``."""

from __future__ import annotations

import pytest

from serving.generative.ai_gateway import RateLimitRule
from serving.generative.budget import MAX_BUCKETS, UsageBudgets
from serving.protocol.errors import ApiError


def rule(key: str, calls: int | None = None, tokens: int | None = None, principal: str | None = None) -> RateLimitRule:
    return RateLimitRule(key=key, calls=calls, tokens=tokens, principal=principal)


def too_many(budgets: UsageBudgets, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as caught:
        budgets.reserve(*args, **kwargs)
    assert caught.value.status_code == 429 and caught.value.error_code == "REQUEST_LIMIT_EXCEEDED"
    return caught.value


def test_a_calls_limit_refuses_the_sixth_request_in_a_minute_with_retry_after():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("user", calls=5)]
    for _ in range(5):
        budgets.reserve("chat", "alice", rules, tokens=10)
    err = too_many(budgets, "chat", "alice", rules, tokens=10)
    assert err.headers["Retry-After"] == "12"  # one call refills in 60/5 s
    assert "per-user limit of 5 calls per minute" in err.message and "'alice'" in err.message


def test_the_bucket_refills_as_time_passes():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", calls=5)]
    for _ in range(5):
        budgets.reserve("chat", "alice", rules, tokens=1, now=100.0)
    assert too_many(budgets, "chat", "alice", rules, tokens=1, now=111.0).headers["Retry-After"] == "1"
    assert budgets.reserve("chat", "alice", rules, tokens=1, now=112.0).tokens == 1  # one call refilled in 12 s
    assert too_many(budgets, "chat", "alice", rules, tokens=1, now=112.0).status_code == 429
    taken = [budgets.reserve("chat", "alice", rules, tokens=1, now=1000.0) for _ in range(5)]
    assert len(taken) == 5  # a minute later the bucket is full again, not fuller
    assert too_many(budgets, "chat", "alice", rules, tokens=1, now=1000.0).status_code == 429


def test_a_tokens_limit_names_the_rule_and_asks_to_wait_for_room():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", tokens=1000)]
    budgets.reserve("chat", "alice", rules, tokens=900)
    err = too_many(budgets, "chat", "bob", rules, tokens=400)
    assert "endpoint limit of 1000 tokens per minute" in err.message and "'bob'" in err.message
    assert err.headers["Retry-After"] == "18"  # 300 tokens at 1000/60 a second


def test_a_refused_request_takes_nothing_from_the_other_buckets():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", tokens=1000), rule("user", calls=1)]
    budgets.reserve("chat", "alice", rules, tokens=100)
    assert "per-user" in too_many(budgets, "chat", "alice", rules, tokens=100).message  # alice's call bucket is empty
    # The refused request took no tokens: bob can still use the 900 left, and not one more.
    assert budgets.reserve("chat", "bob", rules, tokens=900).tokens == 900
    assert "endpoint limit of 1000 tokens" in too_many(budgets, "chat", "carol", rules, tokens=1).message


def test_retry_after_waits_for_every_refusing_bucket():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("user", calls=60), rule("user", tokens=60)]
    budgets.reserve("chat", "alice", rules, tokens=60)
    err = too_many(budgets, "chat", "alice", rules, tokens=30)
    assert err.headers["Retry-After"] == "30"  # calls refill in 1 s, the 30 tokens in 30 s


def test_per_user_buckets_are_independent():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("user", calls=2)]
    for _ in range(2):
        budgets.reserve("chat", "alice", rules, tokens=1)
    assert too_many(budgets, "chat", "alice", rules, tokens=1).status_code == 429
    assert budgets.reserve("chat", "bob", rules, tokens=1).tokens == 1
    assert budgets.reserve("other-endpoint", "alice", rules, tokens=1).tokens == 1


def test_a_principal_scoped_rule_applies_only_to_that_token():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("service_principal", calls=1, principal="batch-job")]
    budgets.reserve("chat", "batch-job", rules, tokens=1)
    err = too_many(budgets, "chat", "batch-job", rules, tokens=1)
    assert "per-service-principal limit of 1 call per minute" in err.message
    for _ in range(10):
        budgets.reserve("chat", "alice", rules, tokens=1)


def test_a_request_larger_than_a_whole_minute_of_tokens_is_a_400():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", calls=10), rule("user", tokens=1000)]
    with pytest.raises(ApiError) as caught:
        budgets.reserve("chat", "alice", rules, tokens=1001)
    assert caught.value.status_code == 400
    assert "up to 1001 tokens" in caught.value.message and "limit of 1000 tokens per minute" in caught.value.message
    assert "max_tokens" in caught.value.message
    for _ in range(10):  # and it took no call from the calls bucket
        budgets.reserve("chat", "alice", rules, tokens=1)


def test_settle_refunds_unused_tokens_but_never_above_the_limit():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", tokens=1000)]
    reservation = budgets.reserve("chat", "alice", rules, tokens=800)
    assert reservation.tokens == 800 and [n for _, n in reservation.entries] == [800]
    budgets.settle(reservation, used_tokens=100)  # 900 left
    budgets.reserve("chat", "alice", rules, tokens=900)
    too_many(budgets, "chat", "alice", rules, tokens=1)
    full = UsageBudgets(clock=lambda: 0.0)
    reservation = full.reserve("chat", "alice", rules, tokens=10)
    full.settle(reservation, used_tokens=0, now=30.0)  # refilled and refunded: still only 1000
    full.reserve("chat", "alice", rules, tokens=1000, now=30.0)
    too_many(full, "chat", "alice", rules, tokens=1, now=30.0)


def test_settle_charges_tokens_used_beyond_the_reservation_and_later_requests_wait():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("endpoint", tokens=600)]
    reservation = budgets.reserve("chat", "alice", rules, tokens=500)
    budgets.settle(reservation, used_tokens=1100)  # 600 - 1100 = -500
    err = too_many(budgets, "chat", "alice", rules, tokens=100)
    assert err.headers["Retry-After"] == "60"  # 600 tokens to refill at 10 a second
    budgets.reserve("chat", "alice", rules, tokens=100, now=60.0)


def test_the_injected_clock_is_used_when_now_is_not_given():
    times = iter([0.0, 0.0, 12.0])
    budgets = UsageBudgets(clock=lambda: next(times))
    rules = [rule("endpoint", calls=5)]
    for _ in range(5):
        budgets.reserve("chat", "alice", rules, tokens=1, now=0.0)
    assert too_many(budgets, "chat", "alice", rules, tokens=1).headers["Retry-After"] == "12"  # the clock said 0
    assert too_many(budgets, "chat", "alice", rules, tokens=1).status_code == 429
    assert budgets.reserve("chat", "alice", rules, tokens=1).tokens == 1  # the clock said 12


def test_rules_that_do_not_apply_or_no_rules_admit_everything():
    budgets = UsageBudgets(clock=lambda: 0.0)
    for _ in range(100):
        assert budgets.reserve("chat", "alice", [], tokens=10**6).entries == ()
    assert len(budgets) == 0


def test_the_token_name_in_the_message_is_cut_to_100_characters():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("user", calls=1)]
    name = "n" * 100 + "TAIL"
    budgets.reserve("chat", name, rules, tokens=1)
    assert "TAIL" not in too_many(budgets, "chat", name, rules, tokens=1).message


def test_full_idle_buckets_are_dropped_past_the_bound():
    budgets = UsageBudgets(clock=lambda: 0.0)
    rules = [rule("user", calls=10)]
    for i in range(MAX_BUCKETS):
        budgets.reserve("chat", f"user-{i}", rules, tokens=1, now=0.0)
    budgets.reserve("chat", "busy", rules, tokens=1, now=0.0)
    assert len(budgets) == MAX_BUCKETS + 1
    budgets.reserve("chat", "late", rules, tokens=1, now=601.0)
    assert len(budgets) == 1  # only the bucket just charged is not full
