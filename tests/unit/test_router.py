from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from serving.traffic.router import choose_entity, pick_replica


@dataclass
class R:
    name: str
    outstanding: int
    pid: int | None = None

    @property
    def id(self) -> str:
        return self.name

    @property
    def url(self) -> str:
        return f"http://{self.name}"

    def alive(self) -> bool:
        return True


def test_traffic_split_follows_percentages_and_is_reproducible():
    weights = [("a", 80), ("b", 20)]
    draws = [choose_entity(weights, random.Random(3)) for _ in range(1)]
    rng = random.Random(42)
    picks = [choose_entity(weights, rng) for _ in range(10_000)]
    assert 0.77 < picks.count("a") / len(picks) < 0.83
    rng2 = random.Random(42)
    assert picks == [choose_entity(weights, rng2) for _ in range(10_000)]
    assert draws[0] in {"a", "b"}


def test_zero_traffic_entity_is_never_chosen():
    rng = random.Random(1)
    assert {choose_entity([("a", 0), ("b", 100)], rng) for _ in range(1000)} == {"b"}
    with pytest.raises(ValueError):
        choose_entity([("a", 0)], rng)


def test_least_outstanding_within_limit():
    replicas = [R("x", 3), R("y", 1), R("z", 1)]
    assert pick_replica(replicas, limit=4).name == "y"
    assert pick_replica([R("x", 4), R("y", 4)], limit=4) is None
    assert pick_replica([R("x", 9)], limit=None).name == "x"
