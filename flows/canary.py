"""Canary flows: ``python -m flows.canary [--endpoint NAME]``; one evaluation per endpoint, acted on at once.

- No canary running and the endpoint's model has a ``challenger`` alias: the challenger joins the
  endpoint as a second served entity (pinned version) with the first step's traffic share; or, with
  ``shadow_percent``, as a shadow sent a copy of that share of the requests, judged on the same requests as the
  champion (``monitoring.shadow``) before it takes any traffic.
- No canary running and the endpoint already splits its traffic between two versions of one model
  (set by hand, with the Databricks SDK say): the split is adopted as a canary at its current share.
- A canary running: the verdict over the inference log since the current step began
  (``monitoring.canary``), then its action (``serving.registry.canary_steps``): advance the traffic share,
  hold, roll back (challenger traffic to 0, alias ``challenger`` removed) or, at 100 %, promote
  (``champion`` moves through ``serving.registry.lifecycle``).
- A finished canary: once the losing entity has had no traffic for ``drain_s``, it leaves the endpoint.

The moves and the state are ``serving.registry.canary``'s: traffic moves by a config change through the
gateway's HTTP API; a traffic-only change restarts no replica, so no request fails because of it. The
state is a JSON file per endpoint under ``$TOLLFREE_HOME/canary/``, written atomically, and mirrored as
tags on the challenger's version. This flow gives the verdict (the inference log, labels and replica
memory read here), and every run leaves a table artifact with the figures and the decision, and a
``tollfree.canary.*`` event. The endpoint's ``monitoring`` settings may turn it off or set its thresholds.
``canary_all`` (the scheduled deployment) runs ``canary`` as a subflow for every endpoint the gateway serves.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import datetime
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event

from flows.fan_out import artifact_key, for_each_endpoint, raise_for
from flows.gateway_api import GatewayApi, GatewayError
from flows.labels import read_labelled
from flows.replica_memory import replica_rss_mb
from monitoring.canary import CanaryVerdict, canary_verdict
from monitoring.shadow import shadow_verdict
from serving.endpoints.monitoring_settings import CanaryThresholds
from serving.inference_log import read_inference_log
from serving.registry.canary import Judge, Outcome, outcome, run_once
from serving.registry.canary_steps import SHADOW, CanaryPlan, CanaryState, with_memory
from serving.registry.canary_store import exclusive
from serving.settings import Settings

EVENT_PREFIX = "tollfree.canary."
TABLE_KEYS = (
    "metric",
    "status",
    "champion",
    "challenger",
    "change",
    "bound",
    "p_value",
    "n_champion",
    "n_challenger",
    "reason",
)


# ---- the verdict ---------------------------------------------------------------------------------
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
    for entity, version in (
        (state.champion_entity, state.champion_version),
        (state.challenger_entity, state.challenger_version),
    ):
        rss = by_entity.get(entity) if by_entity else replica_rss_mb(state.model, version)
        if rss is not None:
            out.append({"timestamp": now.isoformat(), "served_entity": entity, "rss_mb": rss})
    return out


def _memory_frame(state: CanaryState) -> pd.DataFrame:
    frame = pd.DataFrame(list(state.memory), columns=["timestamp", "served_entity", "rss_mb"])
    frame["timestamp"] = pd.to_datetime(frame["timestamp"], utc=True)
    return frame


def _judge(api: GatewayApi, settings: Settings, config: CanaryThresholds, plan: CanaryPlan) -> Judge:
    """The verdict on a running canary over the requests, labels and memory since its step began."""

    def judge(state: CanaryState, now: datetime) -> tuple[CanaryState, CanaryVerdict]:
        since = state.step_started_at()
        if state.phase == SHADOW:  # the two answers to the same requests: the shadows' records too
            log = read_inference_log(
                settings.inference_log_dir, endpoint=state.endpoint, since=since, until=now, shadow=None
            )
            return state, shadow_verdict(log, state.champion_entity, state.challenger_entity, since, now, config)
        state = with_memory(plan, state, _memory_samples(state, now, api))
        log = read_inference_log(settings.inference_log_dir, endpoint=state.endpoint, since=since, until=now)
        labels = read_labelled(settings, state.endpoint, since)
        return state, canary_verdict(
            log,
            state.champion_entity,
            state.challenger_entity,
            since,
            now,
            config,
            labels=labels,
            memory=_memory_frame(state),
        )

    return judge


# ---- the flow ------------------------------------------------------------------------------------
def _report(outcome: Outcome, logger: Any) -> None:
    endpoint = outcome["endpoint"]
    decision = {
        "metric": "decision",
        "status": outcome["action"],
        "reason": outcome["reason"],
        "champion": outcome.get("champion_version"),
        "challenger": outcome.get("challenger_version"),
        "change": f"challenger traffic {outcome.get('traffic')} %",
    }
    rows = [{k: row.get(k) for k in TABLE_KEYS} for row in (*outcome["checks"], decision)]
    create_table_artifact(
        key=artifact_key(f"canary-{endpoint}"),
        table=rows,
        description=f"Canary on {endpoint}: {outcome['action']} ({outcome['reason'][:200]})",
    )
    resource = {"prefect.resource.id": f"tollfree.endpoint.{endpoint}"}
    if outcome.get("model"):
        resource.update(
            {"tollfree.model": str(outcome["model"]), "tollfree.version": str(outcome["challenger_version"])}
        )
    event = EVENT_PREFIX + outcome["action"]
    emit_event(event=event, resource=resource, payload={k: v for k, v in outcome.items() if k != "checks"})
    outcome["event"] = event
    logger.info(
        "canary %s: %s (traffic %s %%): %s", endpoint, outcome["action"], outcome.get("traffic"), outcome["reason"]
    )


@flow(name="canary")
def canary(
    endpoint: str,
    thresholds: dict[str, Any] | None = None,
    steps: list[int] | None = None,
    min_dwell_s: float = 600.0,
    drain_s: float = 60.0,
    gateway_url: str | None = None,
    max_warn_hold_s: float = 1800.0,
    rollout_timeout_s: float = 300.0,
    shadow_percent: int = 0,
    shadow_dwell_s: float = 600.0,
) -> dict[str, Any]:
    """Evaluate the endpoint's canary once and act: start, advance, hold, roll back or promote. Thresholds:
    the ``thresholds`` given, else the endpoint's ``monitoring.canary``, else the defaults. ``shadow_percent`` > 0:
    a canary starts with a shadow phase at that share of the requests, held ``shadow_dwell_s`` with a clean
    verdict before the first step's traffic."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    plan = CanaryPlan(
        steps=tuple(steps) if steps else CanaryPlan().steps,
        min_dwell_s=min_dwell_s,
        drain_s=drain_s,
        max_warn_hold_s=max_warn_hold_s,
        shadow_percent=shadow_percent,
        shadow_dwell_s=shadow_dwell_s,
    )
    client = MlflowClient(settings.tracking_uri)
    api = GatewayApi.from_environ(os.environ, gateway_url)
    try:
        monitoring = api.get(endpoint)["config"].get("monitoring") or {}
        if monitoring.get("enabled") is False:
            done = outcome(endpoint, "disabled", "monitoring is off in the endpoint's config")
        else:
            config = CanaryThresholds.from_mapping(thresholds if thresholds is not None else monitoring.get("canary"))
            with exclusive(settings, endpoint) as mine:
                if not mine:
                    done = outcome(endpoint, "busy", "another canary run holds this endpoint")
                else:
                    done = run_once(
                        api, client, settings, endpoint, plan, _judge(api, settings, config, plan), rollout_timeout_s
                    )
    finally:
        api.close()
    _report(done, logger)
    return dict(done)


@flow(name="canary-all")
def canary_all(
    endpoints: list[str] | None = None,
    steps: list[int] | None = None,
    min_dwell_s: float = 600.0,
    drain_s: float = 60.0,
    gateway_url: str | None = None,
    max_warn_hold_s: float = 1800.0,
    shadow_percent: int = 0,
    shadow_dwell_s: float = 600.0,
) -> dict[str, Any]:
    """``canary`` for every endpoint the gateway serves (or the ones named), each as its own subflow."""
    if endpoints is None:
        api = GatewayApi.from_environ(os.environ, gateway_url)
        try:
            endpoints = api.names()
        finally:
            api.close()
    results = for_each_endpoint(
        "canary",
        canary,
        endpoints,
        steps=steps,
        min_dwell_s=min_dwell_s,
        drain_s=drain_s,
        gateway_url=gateway_url,
        max_warn_hold_s=max_warn_hold_s,
        shadow_percent=shadow_percent,
        shadow_dwell_s=shadow_dwell_s,
    )
    raise_for("canary", results)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=canary.__doc__)
    parser.add_argument("--endpoint", help="one endpoint; default: every endpoint the gateway serves")
    parser.add_argument("--min-dwell-s", type=float, default=600.0)
    parser.add_argument("--drain-s", type=float, default=60.0)
    parser.add_argument(
        "--max-warn-hold-s",
        type=float,
        default=1800.0,
        help="how long from a step's start a warning holds it (then it moves on, warning recorded)",
    )
    parser.add_argument("--steps", type=lambda s: [int(x) for x in s.split(",")], default=None, help="e.g. 5,25,50,100")
    parser.add_argument("--thresholds", type=json.loads, default=None, help='JSON, e.g. {"min_requests": 500}')
    parser.add_argument("--gateway-url", default=None)
    parser.add_argument(
        "--shadow-percent",
        type=int,
        default=0,
        help="a new canary starts as a shadow sent a copy of this share of the requests (default 0: no shadow phase)",
    )
    parser.add_argument("--shadow-dwell-s", type=float, default=600.0, help="the shadow phase, clean, before 5 %%")
    args = parser.parse_args(argv)
    if args.endpoint is None:
        every = canary_all(
            steps=args.steps,
            min_dwell_s=args.min_dwell_s,
            drain_s=args.drain_s,
            gateway_url=args.gateway_url,
            max_warn_hold_s=args.max_warn_hold_s,
            shadow_percent=args.shadow_percent,
            shadow_dwell_s=args.shadow_dwell_s,
        )
        print(json.dumps({e: {k: v for k, v in r.items() if k != "checks"} for e, r in every.items()}, default=str))
        return 0
    result = canary(
        endpoint=args.endpoint,
        thresholds=args.thresholds,
        steps=args.steps,
        min_dwell_s=args.min_dwell_s,
        drain_s=args.drain_s,
        gateway_url=args.gateway_url,
        max_warn_hold_s=args.max_warn_hold_s,
        shadow_percent=args.shadow_percent,
        shadow_dwell_s=args.shadow_dwell_s,
    )
    print(json.dumps({k: v for k, v in result.items() if k != "checks"}, default=str))  # the CLI's answer
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
