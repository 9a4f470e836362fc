"""The canary's moves (``serving.registry.canary.run_once``) against an in-memory endpoint and registry:
start, advance, promote, roll back, clean up, and one run per endpoint at a time."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mlflow.exceptions import MlflowException

from serving.registry import canary, canary_store, endpoint_traffic
from serving.registry.canary_steps import ACTIVE, PROMOTED, ROLLED_BACK, CanaryPlan
from serving.settings import Settings

PLAN = CanaryPlan(steps=(5, 50, 100), min_dwell_s=0, drain_s=0)


@dataclass
class Registry:
    """The part of MlflowClient the moves use, for one model."""

    aliases: dict[str, str]
    tags: dict[tuple[str, str], str] = field(default_factory=dict)

    def get_model_version_by_alias(self, model: str, alias: str) -> SimpleNamespace:
        if alias not in self.aliases:
            raise MlflowException(f"RESOURCE_DOES_NOT_EXIST: {model} has no alias {alias}")
        return SimpleNamespace(name=model, version=self.aliases[alias])

    def get_registered_model(self, model: str) -> SimpleNamespace:
        return SimpleNamespace(aliases=dict(self.aliases))

    def set_registered_model_alias(self, model: str, alias: str, version: str) -> None:
        self.aliases[alias] = version

    def delete_registered_model_alias(self, model: str, alias: str) -> None:
        del self.aliases[alias]

    def set_model_version_tag(self, model: str, version: str, key: str, value: str) -> None:
        self.tags[(version, key)] = value


class Endpoint:
    """The gateway's API for one endpoint: a config applies at once."""

    def __init__(self, name: str, entities: list[dict[str, Any]]) -> None:
        self.view: dict[str, Any] = {"name": name, "state": {"config_update": "NOT_UPDATING"}, "config": {}}
        self.apply(name, endpoint_traffic.config_body({"config": {}}, entities, {entities[0]["name"]: 100}))

    def get(self, endpoint: str) -> dict[str, Any]:
        return copy.deepcopy(self.view)

    def apply(self, endpoint: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        self.view["config"] = copy.deepcopy(body)
        return self.get(endpoint)

    def routes(self) -> dict[str, int]:
        return endpoint_traffic.routes_of(self.view)


def verdicts(*decisions: str):  # a judge that hands out these decisions in turn
    queue = list(decisions)

    def judge(state, now):
        return state, SimpleNamespace(decision=queue.pop(0), reason="because", table=list)

    return judge


@pytest.fixture()
def world(tmp_path: Path):
    settings = Settings.from_environ({"TOLLFREE_HOME": str(tmp_path)})
    registry = Registry({"champion": "1", "challenger": "2"})
    api = Endpoint("e", [{"name": "m-1", "entity_name": "m", "entity_version": "1"}])
    return settings, registry, api


def run(world, judge=None) -> dict[str, Any]:
    settings, registry, api = world
    return canary.run_once(api, registry, settings, "e", PLAN, judge or verdicts(), timeout_s=1)


def test_a_challenger_starts_beside_the_champion_advances_and_is_promoted(world):
    settings, registry, api = world
    started = run(world)
    assert started["action"] == "started" and api.routes() == {"m-1": 95, "m-2": 5}
    assert registry.tags[("2", "canary.status")] == ACTIVE
    assert run(world, verdicts("ok"))["action"] == "advance" and api.routes() == {"m-1": 50, "m-2": 50}
    assert run(world, verdicts("warn"))["action"] == "hold" and api.routes() == {"m-1": 50, "m-2": 50}
    promoted = run(world, verdicts("ok"))
    assert promoted["action"] == "promote" and api.routes() == {"m-1": 0, "m-2": 100}
    assert registry.aliases == {"champion": "2", "previous": "1"}
    assert canary_store.load_state(settings, "e").status == PROMOTED
    cleaned = run(world)
    assert cleaned["action"] == "cleaned" and [e["name"] for e in api.view["config"]["served_entities"]] == ["m-2"]
    assert run(world)["action"] == "idle"  # no challenger left to start


def test_a_rollback_verdict_takes_the_traffic_and_the_alias_away(world):
    _, registry, api = world
    run(world)
    rolled = run(world, verdicts("rollback"))
    assert rolled["action"] == "rollback" and api.routes() == {"m-1": 100, "m-2": 0}
    assert registry.aliases == {"champion": "1"} and registry.tags[("2", "canary.status")] == ROLLED_BACK
    assert run(world)["action"] == "cleaned" and api.routes() == {"m-1": 100}


def test_without_a_challenger_nothing_starts(world):
    settings, registry, _ = world
    del registry.aliases["challenger"]
    assert run(world)["action"] == "idle" and canary_store.load_state(settings, "e") is None


def test_one_run_per_endpoint_at_a_time(world):
    settings = world[0]
    with canary_store.exclusive(settings, "e") as first, canary_store.exclusive(settings, "e") as second:
        assert (first, second) == (True, False)


def _split(
    api: Endpoint, shares: dict[str, int], versions: dict[str, str], model: dict[str, str] | None = None
) -> None:
    """A split set by hand (as an update_config through the SDK would), not by the canary."""
    entities = [{"name": n, "entity_name": (model or {}).get(n, "m"), "entity_version": v} for n, v in versions.items()]
    api.apply("e", endpoint_traffic.config_body({"config": {}}, entities, shares))


def test_a_split_set_by_hand_is_adopted_and_rolled_back_like_a_canary_of_its_own(world):
    settings, registry, api = world
    _split(api, {"blue": 80, "green": 20}, {"blue": "1", "green": "2"})
    adopted = run(world)
    assert adopted["action"] == "adopted" and adopted["traffic"] == 20 and "set by hand" in adopted["reason"]
    state = canary_store.load_state(settings, "e")
    assert (state.champion_entity, state.challenger_entity, state.status) == ("blue", "green", ACTIVE)
    assert api.routes() == {"blue": 80, "green": 20}  # adopting moves no traffic
    rolled = run(world, verdicts("rollback"))
    assert rolled["action"] == "rollback" and api.routes() == {"blue": 100, "green": 0}
    assert registry.aliases == {"champion": "1"}  # the challenger alias (on v2) removed, champion unmoved


def test_without_the_alias_the_smaller_share_is_the_challenger_and_it_advances_from_its_share(world):
    settings, registry, api = world
    del registry.aliases["challenger"]
    _split(api, {"a": 30, "b": 70}, {"a": "2", "b": "1"})
    assert run(world)["action"] == "adopted" and canary_store.load_state(settings, "e").challenger_entity == "a"
    advanced = run(world, verdicts("ok"))
    assert advanced["action"] == "advance" and api.routes() == {"a": 50, "b": 50}  # the next step above 30


def test_a_split_between_two_models_or_equal_shares_without_alias_is_reported_not_acted_on(world):
    settings, registry, api = world
    _split(api, {"a": 90, "b": 10}, {"a": "1", "b": "1"}, model={"a": "m", "b": "other"})
    two_models = run(world)
    assert two_models["action"] == "idle" and "two different models" in two_models["reason"]
    assert api.routes() == {"a": 90, "b": 10} and canary_store.load_state(settings, "e") is None
    del registry.aliases["challenger"]
    _split(api, {"a": 50, "b": 50}, {"a": "1", "b": "3"})
    equal = run(world)
    assert equal["action"] == "idle" and "equally" in equal["reason"]


def test_a_shadow_phase_sends_copies_first_then_the_first_steps_traffic(world):
    settings, registry, api = world
    shadowed = CanaryPlan(steps=(5, 50, 100), min_dwell_s=0, drain_s=0, shadow_percent=30, shadow_dwell_s=0)

    def step(judge=None):  # type: ignore[no-untyped-def]
        return canary.run_once(api, registry, settings, "e", shadowed, judge or verdicts(), timeout_s=1)

    started = step()
    assert started["action"] == "started" and "a copy of 30 %" in started["reason"]
    assert api.routes() == {"m-1": 100, "m-2": 0} and endpoint_traffic.shadows_of(api.view) == {"m-2": 30}
    assert canary_store.load_state(settings, "e").phase == "shadow"
    assert step(verdicts("warn"))["action"] == "hold" and endpoint_traffic.shadows_of(api.view) == {"m-2": 30}
    advanced = step(verdicts("ok"))
    assert advanced["action"] == "advance" and api.routes() == {"m-1": 95, "m-2": 5}
    assert endpoint_traffic.shadows_of(api.view) == {}  # the copies end with the shadow phase
    assert canary_store.load_state(settings, "e").phase == "canary"
    assert step(verdicts("ok"))["action"] == "advance" and api.routes() == {"m-1": 50, "m-2": 50}


def test_a_rollback_in_the_shadow_phase_ends_the_copies_and_the_canary(world):
    settings, registry, api = world
    shadowed = CanaryPlan(steps=(5, 100), min_dwell_s=0, drain_s=0, shadow_percent=100)
    canary.run_once(api, registry, settings, "e", shadowed, verdicts(), timeout_s=1)
    rolled = canary.run_once(api, registry, settings, "e", shadowed, verdicts("rollback"), timeout_s=1)
    assert rolled["action"] == "rollback" and endpoint_traffic.shadows_of(api.view) == {}
    assert registry.aliases == {"champion": "1"} and api.routes() == {"m-1": 100, "m-2": 0}
