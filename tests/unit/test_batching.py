"""Micro-batching plan from a replica's load-time profile, and the gateway-to-replica envelope."""

from __future__ import annotations

import pytest

from serving.protocol import wire
from serving.traffic.batching import BatchPlan, plan_from_profile


def test_a_model_whose_batches_are_cheap_per_row_is_batched_up_to_where_the_gain_flattens():
    # a tree ensemble: ~0.3 ms a call whatever the size up to 16 rows, then per-row cost takes over
    plan = plan_from_profile({1: 0.30, 2: 0.31, 4: 0.32, 8: 0.34, 16: 0.40, 32: 0.75, 64: 1.50})
    assert plan.enabled and plan.max_batch == 16
    assert plan.gain == pytest.approx(0.30 / (0.40 / 16), rel=1e-3)
    assert plan.max_wait_ms == pytest.approx(0.075)  # a quarter of a single-row call


def test_a_model_that_costs_the_same_per_row_at_any_size_is_not_batched():
    plan = plan_from_profile({1: 5.0, 2: 10.0, 4: 20.1, 8: 39.0, 16: 80.0})
    assert not plan.enabled and plan.max_batch == 1 and plan.max_wait_ms == 0


def test_the_gathering_wait_is_capped_and_a_profile_needs_size_one():
    assert plan_from_profile({1: 40.0, 64: 41.0}).max_wait_ms == 1.0
    with pytest.raises(ValueError):
        plan_from_profile({8: 1.0})
    with pytest.raises(ValueError):
        BatchPlan.from_json({"enabled": True, "max_batch": 0, "max_wait_ms": 1, "single_ms": 1, "gain": 2})
    plan = plan_from_profile({1: 1.0, 8: 1.1})
    assert BatchPlan.from_json(plan.to_json()) == plan


def test_the_envelope_carries_bodies_byte_for_byte_both_ways():
    requests = [
        wire.WireRequest("a", "application/json", b'{"inputs": [[1, 2]]}\n'),
        wire.WireRequest("b", "text/csv", b"x,y\n1,2\n"),
        wire.WireRequest("c", "", b""),
    ]
    assert wire.decode_requests(wire.encode_requests(requests)) == requests
    answers = [
        wire.WireAnswer(200, 1, b"[[0.1,0.9]]", b'[{"f":1}]'),
        wire.WireAnswer(400, 0, b'{"error_code":"INVALID_PARAMETER_VALUE","message":"m"}', b""),
    ]
    decoded = wire.decode_answers(wire.encode_answers(answers), expected=2)
    assert decoded == answers
    assert decoded[0].client_body() == b'{"predictions":[[0.1,0.9]]}' and decoded[1].client_body() == answers[1].first


@pytest.mark.parametrize(
    "envelope",
    [
        b"no header line",
        b"[1]\n",
        b'{"items": [["a", "application/json", 5]]}\nabc',
        b'{"items": [["a", "x", 1]]}\nabc',
        b'{"items": [["a", 1, 1]]}\na',
        b'{"items": [["a", "x", -1]]}\n',
    ],
)
def test_a_malformed_envelope_is_refused(envelope):
    with pytest.raises(wire.WireError):
        wire.decode_requests(envelope)


def test_an_answer_envelope_for_the_wrong_number_of_requests_is_refused():
    with pytest.raises(wire.WireError):
        wire.decode_answers(wire.encode_answers([wire.WireAnswer(200, 1, b"[1]", b"")]), expected=2)
