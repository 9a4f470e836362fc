"""A canary on an endpoint, run by anything (the canary flow runs it): its moves.

``run_once`` reads the endpoint through the gateway's API and the endpoint's state, then does one thing:
starts a canary (the model's ``challenger`` joins the endpoint as a second served entity, pinned to its
version, with the first step's share), adopts a split set by hand between two versions of one model (the
version under ``challenger``, else the smaller share, is judged as the challenger from its current share;
a split between two models is reported, not acted on), evaluates a running one and acts on the verdict at once
(``canary_steps.next_action``: advance, hold, roll back, or at 100 % promote through ``lifecycle``), or
removes the losing entity of a finished one once it has drained. The verdict is the caller's ``judge``:
its statistics live in ``monitoring/``, which this package does not import.

Traffic moves by a config change through the API (``EndpointApi``); a traffic-only change restarts no
replica (``endpoint_traffic``). The state is kept between runs by ``canary_store`` (a JSON file per endpoint and
a lock that lets one run per endpoint act) and mirrored as ``canary.*`` tags on the challenger's version.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from serving.registry import lifecycle, versions
from serving.registry.canary_steps import (
    ACTIVE,
    CANARY,
    FAILED,
    HOLD,
    PROMOTE,
    PROMOTED,
    ROLLBACK,
    ROLLED_BACK,
    SHADOW,
    Action,
    CanaryPlan,
    CanaryState,
    drained,
    next_action,
)
from serving.registry.canary_store import load_state, save_state
from serving.registry.endpoint_traffic import EndpointApi, config_body, entity_input, routes_of, served, set_traffic
from serving.settings import Settings

if TYPE_CHECKING:
    from mlflow import MlflowClient


class Verdict(Protocol):
    """What ``monitoring.canary.canary_verdict`` returns, as far as acting on it goes (read-only, so a frozen
    dataclass satisfies it)."""

    @property
    def decision(self) -> str: ...  # ok | warn | rollback | insufficient
    @property
    def reason(self) -> str: ...

    def table(self) -> list[dict[str, Any]]: ...


# The verdict on an active canary now: the state (with anything the judge recorded, memory samples) and it.
Judge = Callable[[CanaryState, datetime], tuple[CanaryState, Verdict]]


def utc_now() -> datetime:
    return datetime.now(UTC)


def _tag(client: MlflowClient, state: CanaryState, **tags: Any) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(state.model, state.challenger_version, f"canary.{key}", str(value)[:4000])


# ---- one run's outcome ---------------------------------------------------------------------------
Outcome = dict  # what a run did: ``action``, ``reason`` and the figures; reported as an artifact and an event


def outcome(
    endpoint: str, action: str, reason: str, state: CanaryState | None = None, verdict: Verdict | None = None
) -> Outcome:
    return Outcome(
        endpoint=endpoint,
        action=action,
        reason=reason,
        decision=verdict.decision if verdict else None,
        traffic=state.traffic if state else None,
        status=state.status if state else None,
        model=state.model if state else None,
        challenger_version=state.challenger_version if state else None,
        champion_version=state.champion_version if state else None,
        checks=verdict.table() if verdict else [],
    )


# ---- starting ------------------------------------------------------------------------------------
def _start(
    api: EndpointApi, client: MlflowClient, endpoint: str, view: dict[str, Any], plan: CanaryPlan, timeout_s: float
) -> tuple[Outcome, CanaryState | None]:
    entities = view["config"]["served_entities"]
    if len(entities) == 2:
        return _adopt(client, endpoint, view)
    if len(entities) != 1:
        return outcome(
            endpoint,
            "idle",
            f"endpoint serves {len(entities)} entities; a canary starts from one champion "
            "entity or adopts a split between two versions of one model",
        ), None
    champion = entities[0]
    model, champion_version = champion["entity_name"], str(champion["entity_version"])
    try:
        challenger_version = str(versions.resolve(client, model, lifecycle.CHALLENGER, alias=True).version)
    except LookupError:
        return outcome(endpoint, "idle", f"model {model} has no {lifecycle.CHALLENGER!r} version"), None
    if challenger_version == champion_version:
        return outcome(endpoint, "idle", f"the challenger of {model} is the served version {champion_version}"), None
    name = f"{model}-{challenger_version}"
    if name == champion["name"]:
        name = f"{name}-canary"
    challenger = {
        "name": name,
        "entity_name": model,
        "entity_version": challenger_version,
        **{
            k: champion[k]
            for k in (
                "workload_size",
                "max_concurrency",
                "min_replicas",
                "max_replicas",
                "scale_to_zero_enabled",
                "autoscaling",
            )
            if k in champion
        },
    }
    shadowed = plan.shadow_percent > 0  # a shadow phase first: copies of requests, no traffic
    first = 0 if shadowed else plan.steps[0]
    shadows = {name: plan.shadow_percent} if shadowed else {}
    routes = {champion["name"]: 100 - first, name: first}
    settled = api.apply(endpoint, config_body(view, [entity_input(champion), challenger], routes, shadows), timeout_s)
    now = utc_now()
    state = CanaryState(
        endpoint=endpoint,
        model=model,
        champion_entity=champion["name"],
        champion_version=champion_version,
        challenger_entity=name,
        challenger_version=challenger_version,
        status=ACTIVE,
        traffic=first,
        step_started=now.isoformat(),
        started=now.isoformat(),
        phase=SHADOW if shadowed else CANARY,
    )
    if settled["state"]["config_update"] != "NOT_UPDATING":
        why = f"challenger {model} v{challenger_version} failed to deploy: {settled.get('state_message', '')}"
        lifecycle.drop(client, state.model, lifecycle.CHALLENGER, state.challenger_version)
        state = state.moved(
            now, status=FAILED, traffic=0, ended=now.isoformat(), cleaned=True, last_decision=ROLLBACK, last_reason=why
        )
        _tag(client, state, status=FAILED, reason=why)
        return outcome(endpoint, ROLLBACK, why, state), state
    state = state.moved(now, status=ACTIVE, traffic=first, last_reason="canary started")
    _tag(client, state, endpoint=endpoint, status=ACTIVE, traffic=first, started=now.isoformat())
    takes = f"a copy of {plan.shadow_percent} % of the requests to" if shadowed else f"{first} % of"
    return outcome(
        endpoint, "started", f"{model} v{challenger_version} takes {takes} {endpoint} beside v{champion_version}", state
    ), state


def _adopt(client: MlflowClient, endpoint: str, view: dict[str, Any]) -> tuple[Outcome, CanaryState | None]:
    """A split set by hand (an ``update_config`` with two versions of one model) becomes a canary at its
    share: the challenger is the version under the ``challenger`` alias, else the one with the smaller share.
    A split between two different models is reported, not acted on."""
    first, second = view["config"]["served_entities"]
    names = f"{first['entity_name']} ({first['name']}) and {second['entity_name']} ({second['name']})"
    if first["entity_name"] != second["entity_name"]:
        return outcome(endpoint, "idle", f"split between two different models, {names}: reported, not acted on"), None
    model, routes = first["entity_name"], routes_of(view)
    try:
        aliased = str(versions.resolve(client, model, lifecycle.CHALLENGER, alias=True).version)
    except LookupError:
        aliased = None
    by_alias = [e for e in (first, second) if str(e.get("entity_version")) == aliased]
    if len(by_alias) == 1:
        challenger = by_alias[0]
    elif routes.get(first["name"], 0) != routes.get(second["name"], 0):
        challenger = min((first, second), key=lambda e: routes.get(e["name"], 0))
    else:
        return outcome(
            endpoint,
            "idle",
            f"{names} share the traffic equally and neither holds the "
            f"{lifecycle.CHALLENGER!r} alias: no side to judge as the challenger",
        ), None
    champion = second if challenger is first else first
    share = routes.get(challenger["name"], 0)
    if share == 0 or share == 100:
        return outcome(
            endpoint, "idle", f"the challenger {challenger['name']} has {share} % of the traffic: nothing to judge"
        ), None
    now = utc_now()
    state = CanaryState(
        endpoint=endpoint,
        model=model,
        champion_entity=champion["name"],
        champion_version=str(champion["entity_version"]),
        challenger_entity=challenger["name"],
        challenger_version=str(challenger["entity_version"]),
        status=ACTIVE,
        traffic=share,
        step_started=now.isoformat(),
        started=now.isoformat(),
    )
    why = (
        f"split set by hand adopted: {model} v{state.challenger_version} ({challenger['name']}) at {share} % beside "
        f"v{state.champion_version} ({champion['name']}); judged from now on"
    )
    state = state.moved(now, status=ACTIVE, traffic=share, last_reason=why)
    _tag(client, state, endpoint=endpoint, status=ACTIVE, traffic=share, started=now.isoformat(), adopted="true")
    return outcome(endpoint, "adopted", why, state), state


# ---- evaluating and acting -----------------------------------------------------------------------
def _evaluate(
    api: EndpointApi,
    client: MlflowClient,
    state: CanaryState,
    view: dict[str, Any],
    plan: CanaryPlan,
    judge: Judge,
    timeout_s: float,
) -> tuple[Outcome, CanaryState]:
    endpoint, now = state.endpoint, utc_now()
    if served(view, state.champion_entity) is None or served(view, state.challenger_entity) is None:
        why = "the endpoint's config no longer serves both the champion and the challenger; canary abandoned"
        state = state.moved(now, status=FAILED, ended=now.isoformat(), cleaned=True, last_reason=why)
        return outcome(endpoint, "abandoned", why, state), state
    state, verdict = judge(state, now)
    action = next_action(plan, state, verdict.decision, verdict.reason, now)
    state = _act(api, client, state, view, action, timeout_s)
    return outcome(endpoint, action.kind, action.reason, state, verdict), state


def _act(
    api: EndpointApi, client: MlflowClient, state: CanaryState, view: dict[str, Any], action: Action, timeout_s: float
) -> CanaryState:
    endpoint = state.endpoint
    if action.kind == HOLD:
        return state.moved(utc_now(), last_decision=HOLD, last_reason=action.reason)
    routes = {state.champion_entity: 100 - action.traffic, state.challenger_entity: action.traffic}
    shadows: dict[str, int] | None = {} if state.phase == SHADOW else None  # leaving the shadow phase ends the copies
    set_traffic(api, endpoint, view, routes, timeout_s, shadows)
    now = utc_now()
    if action.kind == ROLLBACK:
        lifecycle.drop(client, state.model, lifecycle.CHALLENGER, state.challenger_version)
        state = state.moved(
            now, status=ROLLED_BACK, traffic=0, ended=now.isoformat(), last_decision=ROLLBACK, last_reason=action.reason
        )
        _tag(client, state, status=ROLLED_BACK, traffic=0, reason=action.reason, ended=now.isoformat())
        return state
    if action.kind == PROMOTE:
        lifecycle.make_champion(
            client,
            state.model,
            state.challenger_version,
            who="canary",
            why=f"canary on {endpoint}: {action.reason}",
            now=now,
        )
        state = state.moved(
            now, status=PROMOTED, traffic=100, ended=now.isoformat(), last_decision=PROMOTE, last_reason=action.reason
        )
        _tag(client, state, status=PROMOTED, traffic=100, ended=now.isoformat())
        return state
    state = state.moved(
        now,
        traffic=action.traffic,
        phase=CANARY,
        step_started=now.isoformat(),
        last_decision=action.kind,
        last_reason=action.reason,
    )
    _tag(client, state, traffic=action.traffic)
    return state


def _clean_up(
    api: EndpointApi, state: CanaryState, view: dict[str, Any], plan: CanaryPlan, timeout_s: float
) -> CanaryState | None:
    """Remove the losing entity once drained; None when there is nothing (yet) to do."""
    if not drained(plan, state, utc_now()):
        return None
    loser = state.champion_entity if state.status == PROMOTED else state.challenger_entity
    routes = routes_of(view)
    keep = [e for e in view["config"]["served_entities"] if e["name"] != loser]
    if len(keep) != len(view["config"]["served_entities"]) and keep and routes.get(loser, 0) == 0:
        settled = api.apply(state.endpoint, config_body(view, [entity_input(e) for e in keep], routes), timeout_s)
        if settled["state"]["config_update"] != "NOT_UPDATING":
            raise RuntimeError(
                f"endpoint {state.endpoint}: removing {loser} failed: {settled.get('state_message', '')}"
            )
    return state.moved(utc_now(), cleaned=True, last_reason=f"{loser} removed from {state.endpoint}")


# ---- one run -------------------------------------------------------------------------------------
def run_once(
    api: EndpointApi,
    client: MlflowClient,
    settings: Settings,
    endpoint: str,
    plan: CanaryPlan,
    judge: Judge,
    timeout_s: float,
) -> Outcome:
    """Start, evaluate and act, or clean up: one step of the endpoint's canary, its state saved. Hold the
    endpoint's ``exclusive`` lock around it."""
    view = api.get(endpoint)
    state = load_state(settings, endpoint)
    if view["state"]["config_update"] == "IN_PROGRESS":
        return outcome(endpoint, HOLD, "a config update of the endpoint is in progress", state)
    if state is not None and state.status == ACTIVE:
        done, state = _evaluate(api, client, state, view, plan, judge, timeout_s)
        save_state(settings, state)
        return done
    if state is not None and not state.cleaned:
        cleaned = _clean_up(api, state, view, plan, timeout_s)
        if cleaned is None:
            return outcome(
                endpoint,
                "draining",
                f"waiting {plan.drain_s:.0f} s after the canary ended before removing the losing entity",
                state,
            )
        save_state(settings, cleaned)
        view = api.get(endpoint)
        done, started = _start(api, client, endpoint, view, plan, timeout_s)
        if started is None:  # nothing new to start: this run's act was the clean-up
            return outcome(endpoint, "cleaned", cleaned.last_reason or "", cleaned)
    else:
        done, started = _start(api, client, endpoint, view, plan, timeout_s)
    if started is not None:
        save_state(settings, started)
    return done
