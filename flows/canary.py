"""Canary flow: ``python -m flows.canary --endpoint NAME``; one evaluation, acted on at once.

- No canary running and the endpoint's model has a ``challenger`` alias: the challenger joins the
  endpoint as a second served entity (pinned version) with the first step's traffic share.
- A canary running: the verdict over the inference log since the current step began
  (``monitoring.canary``), then its action (``monitoring.canary_steps``): advance the traffic share,
  hold, roll back (challenger traffic to 0, alias ``challenger`` removed) or, at 100 %, promote
  (``champion`` moves through ``serving.registry.lifecycle``).
- A finished canary: once the losing entity has had no traffic for ``drain_s``, it leaves the endpoint.

Traffic moves by a config change through the gateway's HTTP API; a traffic-only change restarts no
replica, so no request fails because of it. The state is a JSON file per endpoint under
``$TOLLFREE_HOME/canary/``, written atomically, and mirrored as tags on the challenger's version. Every
run leaves a table artifact with the figures and the decision, and a ``tollfree.canary.*`` event.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event

from flows.gateway_api import GatewayApi, GatewayError, config_body, entity_input, routes_of
from flows.labels import read_labelled
from flows.replica_memory import replica_rss_mb
from flows.skew import artifact_key
from monitoring.canary import CanaryThresholds, CanaryVerdict, canary_verdict
from monitoring.canary_steps import (
    ACTIVE, FAILED, HOLD, PROMOTE, PROMOTED, ROLLBACK, ROLLED_BACK, Action, CanaryPlan, CanaryState, drained,
    next_action, with_memory,
)
from serving.inference_log import read_inference_log
from serving.registry import lifecycle, versions
from serving.settings import Settings

EVENT_PREFIX = "tollfree.canary."


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


# ---- durable state -------------------------------------------------------------------------------
def state_path(settings: Settings, endpoint: str) -> Path:
    return settings.home / "canary" / f"{quote(endpoint, safe='')}.json"


def load_state(settings: Settings, endpoint: str) -> CanaryState | None:
    path = state_path(settings, endpoint)
    return CanaryState.from_dict(json.loads(path.read_text())) if path.exists() else None


def save_state(settings: Settings, state: CanaryState) -> None:
    path = state_path(settings, state.endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=1, default=str))
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive(settings: Settings, endpoint: str) -> Iterator[bool]:
    """One canary run per endpoint at a time; yields False if another holds the lock."""
    path = state_path(settings, endpoint).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _tag(client: MlflowClient, state: CanaryState, **tags: Any) -> None:
    for key, value in tags.items():
        client.set_model_version_tag(state.model, state.challenger_version, f"canary.{key}", str(value)[:4000])


# ---- one run's outcome ---------------------------------------------------------------------------
Outcome = dict  # what a run did: ``action``, ``reason`` and the figures; reported as an artifact and an event
TABLE_KEYS = ("metric", "status", "champion", "challenger", "change", "bound", "p_value", "n_champion", "n_challenger", "reason")


def _outcome(endpoint: str, action: str, reason: str, state: CanaryState | None = None,
             verdict: CanaryVerdict | None = None) -> Outcome:
    return Outcome(endpoint=endpoint, action=action, reason=reason, decision=verdict.decision if verdict else None,
                   traffic=state.traffic if state else None, status=state.status if state else None,
                   model=state.model if state else None, challenger_version=state.challenger_version if state else None,
                   champion_version=state.champion_version if state else None,
                   checks=verdict.table() if verdict else [])


def _entity(view: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((e for e in view["config"]["served_entities"] if e["name"] == name), None)


def _set_traffic(api: GatewayApi, endpoint: str, view: dict[str, Any], routes: dict[str, int], timeout_s: float) -> dict[str, Any]:
    entities = [entity_input(e) for e in view["config"]["served_entities"]]
    settled = api.apply(endpoint, config_body(view, entities, routes), timeout_s)
    if settled["state"]["config_update"] != "NOT_UPDATING" or routes_of(settled) != {**routes_of(view), **routes}:
        raise RuntimeError(f"endpoint {endpoint}: traffic change did not apply ({settled.get('state_message', settled['state'])})")
    return settled


# ---- starting ------------------------------------------------------------------------------------
def _start(api: GatewayApi, client: MlflowClient, settings: Settings, endpoint: str, view: dict[str, Any],
           plan: CanaryPlan, timeout_s: float) -> tuple[Outcome, CanaryState | None]:
    routes = routes_of(view)
    serving = [e for e in view["config"]["served_entities"] if routes.get(e["name"], 0) > 0]
    if len(serving) != 1 or len(view["config"]["served_entities"]) != 1:
        return _outcome(endpoint, "idle", f"endpoint serves {len(view['config']['served_entities'])} entities; "
                                          "a canary starts from one champion entity"), None
    champion = serving[0]
    model, champion_version = champion["entity_name"], str(champion["entity_version"])
    try:
        challenger_version = str(versions.resolve(client, model, lifecycle.CHALLENGER, alias=True).version)
    except LookupError:
        return _outcome(endpoint, "idle", f"model {model} has no {lifecycle.CHALLENGER!r} version"), None
    if challenger_version == champion_version:
        return _outcome(endpoint, "idle", f"the challenger of {model} is the served version {champion_version}"), None
    name = f"{model}-{challenger_version}"
    if name == champion["name"]:
        name = f"{name}-canary"
    challenger = {"name": name, "entity_name": model, "entity_version": challenger_version,
                  **{k: champion[k] for k in ("workload_size", "max_concurrency", "min_replicas", "max_replicas", "scale_to_zero_enabled",
                                              "autoscaling") if k in champion}}
    first = plan.steps[0]
    body = config_body(view, [entity_input(champion), challenger], {champion["name"]: 100 - first, name: first})
    settled = api.apply(endpoint, body, timeout_s)
    now = utc_now()
    state = CanaryState(endpoint=endpoint, model=model, champion_entity=champion["name"], champion_version=champion_version,
                        challenger_entity=name, challenger_version=challenger_version, status=ACTIVE, traffic=first,
                        step_started=now.isoformat(), started=now.isoformat())
    if settled["state"]["config_update"] != "NOT_UPDATING":
        why = f"challenger {model} v{challenger_version} failed to deploy: {settled.get('state_message', '')}"
        _drop_challenger_alias(client, state)
        state = state.moved(now, status=FAILED, traffic=0, ended=now.isoformat(), cleaned=True, last_decision=ROLLBACK,
                            last_reason=why)
        _tag(client, state, status=FAILED, reason=why)
        return _outcome(endpoint, ROLLBACK, why, state), state
    state = state.moved(now, status=ACTIVE, traffic=first, last_reason="canary started")
    _tag(client, state, endpoint=endpoint, status=ACTIVE, traffic=first, started=now.isoformat())
    return _outcome(endpoint, "started", f"{model} v{challenger_version} takes {first} % of {endpoint} beside "
                                         f"v{champion_version}", state), state


def _drop_challenger_alias(client: MlflowClient, state: CanaryState) -> None:
    lifecycle.drop(client, state.model, lifecycle.CHALLENGER, state.challenger_version)


# ---- evaluating and acting -----------------------------------------------------------------------
def _memory_samples(state: CanaryState, now: datetime, api: GatewayApi | None = None) -> list[dict[str, Any]]:
    """Each side's replica memory: from the gateway (it knows every replica, warm-pool ones included),
    else from /proc by command line."""
    by_entity: dict[str, float] = {}
    if api is not None:
        try:
            for replica in api.replicas(state.endpoint):
                if replica.get("rss_mb") is not None:
                    key = str(replica["served_entity"])
                    by_entity[key] = by_entity.get(key, 0.0) + float(replica["rss_mb"])
        except GatewayError:
            by_entity = {}
    out = []
    for entity, version in ((state.champion_entity, state.champion_version), (state.challenger_entity, state.challenger_version)):
        rss = by_entity.get(entity) if by_entity else replica_rss_mb(state.model, version)
        if rss is not None:
            out.append({"timestamp": now.isoformat(), "served_entity": entity, "rss_mb": rss})
    return out


def _memory_frame(state: CanaryState) -> pd.DataFrame:
    frame = pd.DataFrame(list(state.memory), columns=["timestamp", "served_entity", "rss_mb"])
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def _evaluate(api: GatewayApi, client: MlflowClient, settings: Settings, state: CanaryState, view: dict[str, Any],
              config: CanaryThresholds, plan: CanaryPlan, timeout_s: float) -> tuple[Outcome, CanaryState]:
    endpoint, now = state.endpoint, utc_now()
    if _entity(view, state.champion_entity) is None or _entity(view, state.challenger_entity) is None:
        why = "the endpoint's config no longer serves both the champion and the challenger; canary abandoned"
        state = state.moved(now, status=FAILED, ended=now.isoformat(), cleaned=True, last_reason=why)
        return _outcome(endpoint, "abandoned", why, state), state
    since = state.step_started_at()
    state = with_memory(plan, state, _memory_samples(state, now, api))
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=since, until=now)
    labels = read_labelled(settings, endpoint, since)
    verdict = canary_verdict(log, state.champion_entity, state.challenger_entity, since, now, config,
                             labels=labels, memory=_memory_frame(state))
    action = next_action(plan, state, verdict.decision, verdict.reason, now)
    state = _act(api, client, state, view, action, timeout_s)
    return _outcome(endpoint, action.kind, action.reason, state, verdict), state


def _act(api: GatewayApi, client: MlflowClient, state: CanaryState, view: dict[str, Any], action: Action,
         timeout_s: float) -> CanaryState:
    endpoint = state.endpoint
    if action.kind == HOLD:
        return state.moved(utc_now(), last_decision=HOLD, last_reason=action.reason)
    routes = {state.champion_entity: 100 - action.traffic, state.challenger_entity: action.traffic}
    _set_traffic(api, endpoint, view, routes, timeout_s)
    now = utc_now()
    if action.kind == ROLLBACK:
        _drop_challenger_alias(client, state)
        state = state.moved(now, status=ROLLED_BACK, traffic=0, ended=now.isoformat(), last_decision=ROLLBACK,
                            last_reason=action.reason)
        _tag(client, state, status=ROLLED_BACK, traffic=0, reason=action.reason, ended=now.isoformat())
        return state
    if action.kind == PROMOTE:
        lifecycle.make_champion(client, state.model, state.challenger_version, who="canary",
                                why=f"canary on {endpoint}: {action.reason}", now=now)
        state = state.moved(now, status=PROMOTED, traffic=100, ended=now.isoformat(), last_decision=PROMOTE,
                            last_reason=action.reason)
        _tag(client, state, status=PROMOTED, traffic=100, ended=now.isoformat())
        return state
    state = state.moved(now, traffic=action.traffic, step_started=now.isoformat(), last_decision=action.kind,
                        last_reason=action.reason)
    _tag(client, state, traffic=action.traffic)
    return state


def _clean_up(api: GatewayApi, state: CanaryState, view: dict[str, Any], plan: CanaryPlan, timeout_s: float) -> CanaryState | None:
    """Remove the losing entity once drained; None when there is nothing (yet) to do."""
    if not drained(plan, state, utc_now()):
        return None
    loser = state.champion_entity if state.status == PROMOTED else state.challenger_entity
    routes = routes_of(view)
    keep = [e for e in view["config"]["served_entities"] if e["name"] != loser]
    if len(keep) != len(view["config"]["served_entities"]) and keep and routes.get(loser, 0) == 0:
        settled = api.apply(state.endpoint, config_body(view, [entity_input(e) for e in keep], routes), timeout_s)
        if settled["state"]["config_update"] != "NOT_UPDATING":
            raise RuntimeError(f"endpoint {state.endpoint}: removing {loser} failed: {settled.get('state_message', '')}")
    return state.moved(utc_now(), cleaned=True, last_reason=f"{loser} removed from {state.endpoint}")


# ---- the flow ------------------------------------------------------------------------------------
def _report(outcome: Outcome, logger: Any) -> None:
    endpoint = outcome["endpoint"]
    decision = {"metric": "decision", "status": outcome["action"], "reason": outcome["reason"],
                "champion": outcome.get("champion_version"), "challenger": outcome.get("challenger_version"),
                "change": f"challenger traffic {outcome.get('traffic')} %"}
    rows = [{k: row.get(k) for k in TABLE_KEYS} for row in (*outcome["checks"], decision)]
    create_table_artifact(key=artifact_key(f"canary-{endpoint}"), table=rows,
                          description=f"Canary on {endpoint}: {outcome['action']} ({outcome['reason'][:200]})")
    resource = {"prefect.resource.id": f"tollfree.endpoint.{endpoint}"}
    if outcome.get("model"):
        resource.update({"tollfree.model": str(outcome["model"]), "tollfree.version": str(outcome["challenger_version"])})
    event = EVENT_PREFIX + outcome["action"]
    emit_event(event=event, resource=resource, payload={k: v for k, v in outcome.items() if k != "checks"})
    outcome["event"] = event
    logger.info("canary %s: %s (traffic %s %%): %s", endpoint, outcome["action"], outcome.get("traffic"), outcome["reason"])


@flow(name="canary")
def canary(endpoint: str, thresholds: dict[str, Any] | None = None, steps: list[int] | None = None,
           min_dwell_s: float = 600.0, drain_s: float = 60.0, gateway_url: str | None = None,
           max_warn_hold_s: float = 1800.0,
           rollout_timeout_s: float = 300.0) -> dict[str, Any]:
    """Evaluate the endpoint's canary once and act: start, advance, hold, roll back or promote."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    config = CanaryThresholds.from_mapping(thresholds)
    plan = CanaryPlan(steps=tuple(steps) if steps else CanaryPlan().steps, min_dwell_s=min_dwell_s, drain_s=drain_s,
                      max_warn_hold_s=max_warn_hold_s)
    client = MlflowClient(settings.tracking_uri)
    api = GatewayApi.from_environ(os.environ, gateway_url)
    try:
        with exclusive(settings, endpoint) as mine:
            if not mine:
                outcome = _outcome(endpoint, "busy", "another canary run holds this endpoint")
            else:
                outcome = _run_once(api, client, settings, endpoint, config, plan, rollout_timeout_s)
    finally:
        api.close()
    _report(outcome, logger)
    return dict(outcome)


def _run_once(api: GatewayApi, client: MlflowClient, settings: Settings, endpoint: str, config: CanaryThresholds,
              plan: CanaryPlan, timeout_s: float) -> Outcome:
    view = api.get(endpoint)
    state = load_state(settings, endpoint)
    if view["state"]["config_update"] == "IN_PROGRESS":
        return _outcome(endpoint, HOLD, "a config update of the endpoint is in progress", state)
    if state is not None and state.status == ACTIVE:
        outcome, state = _evaluate(api, client, settings, state, view, config, plan, timeout_s)
        save_state(settings, state)
        return outcome
    if state is not None and not state.cleaned:
        cleaned = _clean_up(api, state, view, plan, timeout_s)
        if cleaned is None:
            return _outcome(endpoint, "draining", f"waiting {plan.drain_s:.0f} s after the canary ended before "
                                                  "removing the losing entity", state)
        save_state(settings, cleaned)
        view = api.get(endpoint)
        outcome, started = _start(api, client, settings, endpoint, view, plan, timeout_s)
        if started is None:  # nothing new to start: this run's act was the clean-up
            return _outcome(endpoint, "cleaned", cleaned.last_reason or "", cleaned)
    else:
        outcome, started = _start(api, client, settings, endpoint, view, plan, timeout_s)
    if started is not None:
        save_state(settings, started)
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=canary.__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--min-dwell-s", type=float, default=600.0)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument("--max-warn-hold-s", type=float, default=1800.0,
                        help="how long from a step's start a warning holds it (then it moves on, warning recorded)")
    parser.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")], default=None, help="e.g. 5,25,50,100")
    parser.add_argument("--thresholds", type=json.loads, default=None, help='JSON, e.g. {"min_requests": 500}')
    parser.add_argument("--gateway-url", default=None)
    args = parser.parse_args(argv)
    result = canary(endpoint=args.endpoint, thresholds=args.thresholds, steps=args.steps, min_dwell_s=args.min_dwell_s,
                    drain_s=args.drain_s, gateway_url=args.gateway_url, max_warn_hold_s=args.max_warn_hold_s)
    print(json.dumps({k: v for k, v in result.items() if k != "checks"}, default=str))  # the CLI's answer
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
