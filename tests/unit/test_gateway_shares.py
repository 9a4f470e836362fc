"""Each gateway's share of a replica's admission (``serving.gateway.gateway_shares``): who is there, from the load
board's readings, and the factor the policy's limit is scaled by, remembered for ``REMEMBER_S``."""

from __future__ import annotations

from serving.gateway.gateway_shares import Shares, members
from serving.state.scaling import Reading

KEY, OTHER = ("e", "champion"), ("e", "challenger")


def _reading(gateway: str, at: float, key=KEY) -> Reading:
    return Reading(gateway, key[0], key[1], "models:/m/1", at, {"heartbeat": 1})


def test_members_count_the_other_gateways_with_a_fresh_reading_per_entity() -> None:
    readings = [_reading("b", 10.0), _reading("b", 10.0, OTHER), _reading("c", 7.0), _reading("d", 9.5)]
    assert members(readings, since=9.0) == {KEY: 2, OTHER: 1}


def test_the_factor_is_the_most_gateways_recently_over_the_gateways_now_and_forgets_after_its_window() -> None:
    shares = Shares(remember_s=60.0)
    shares.observe(0.0, [KEY], {KEY: 1})  # two gateways
    assert shares.factor(KEY) == 1.0 and shares.limit(KEY, 3) == 3
    shares.observe(1.0, [KEY], {})  # the other went
    assert shares.factor(KEY) == 2.0 and shares.limit(KEY, 3) == 6
    shares.observe(30.0, [KEY], {})
    assert shares.limit(KEY, 3) == 6
    shares.observe(61.0, [KEY], {})  # gone for longer than the window: no longer a sharer
    assert shares.factor(KEY) == 1.0
    shares.observe(62.0, [OTHER], {})  # an entity no longer live is dropped
    assert shares.factor(KEY) == 1.0 and shares.limit(KEY, 0) == 1
