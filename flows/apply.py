"""Apply flow: make a gateway's endpoints match endpoints files, changing only what differs.

``python -m flows.apply -f infra/endpoints.yaml [-f FILE ...] [--dry-run] [--gateway-url URL] [--registry-uri URI]``

Every file is read and checked first (``flows.endpoint_file``); a file with a problem is refused, naming the file,
line and field, before any endpoint changes; so is a file naming an alias the registry does not have (every
endpoint is planned before the first is changed). Each declared endpoint is compared with what the gateway
serves: its config as the gateway would render it (an entity by alias at the version the registry's alias names
now) and its AI gateway. An endpoint that matches is left alone (unless its last rollout failed: then it is sent again),
so applying the same file twice changes nothing and restarts no replica; one that differs is created or updated
and waited for. An alias that moved (a promotion, or a replication from another region) is a difference, so
applying rolls the endpoint to the alias' new version.
``--dry-run`` prints the differences and changes nothing. Endpoints the files do not name are left as they are.

Tags and the description are set when an endpoint is created; the API has no route that changes them later,
so a difference there is reported, not applied.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from mlflow import MlflowClient
from prefect import flow, get_run_logger

from flows.endpoint_file import DeclaredEndpoint, EndpointFileError, read_endpoints
from flows.gateway_api import GatewayApi, GatewayError
from serving.endpoints.spec import registry_entities
from serving.endpoints.views import config_view
from serving.generative.ai_gateway import ai_gateway_view
from serving.registry import versions
from serving.registry.errors import answering
from serving.settings import Settings

Action = Literal["create", "update", "unchanged"]
Resolve = Callable[[str, str], str]  # (model, alias) -> the version the alias names now
_EXTENSION_BLOCKS = ("monitoring", "stream_inputs")  # left out of a file: removed (keep_extensions keeps them)


@dataclass(frozen=True)
class Change:
    """What applying does to one endpoint: the action, the config and AI gateway differences as unified diffs."""

    endpoint: str
    action: Action
    config_diff: str = ""
    ai_gateway_diff: str = ""
    notes: tuple[str, ...] = ()

    @property
    def changes(self) -> bool:
        return self.action != "unchanged"


def _comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A config view without what the gateway derives (deployment states, the legacy served_models, the version)."""
    out = {k: v for k, v in config.items() if k not in ("served_models", "config_version", "start_time")}
    out["served_entities"] = [{k: v for k, v in e.items() if k != "state"} for e in config.get("served_entities", [])]
    return out


def desired_config(endpoint: DeclaredEndpoint, resolve: Resolve) -> dict[str, Any]:
    """The declared config as the gateway would render it, each alias at the version it names now."""
    config = endpoint.config.model_copy(deep=True)
    for entity in registry_entities(config):
        if entity.entity_alias is not None:
            entity.resolved_version = resolve(str(entity.entity_name), entity.entity_alias)
    return _comparable(config_view(config, 0, {}))


def _diff(current: dict[str, Any], desired: dict[str, Any], label: str) -> str:
    def dump(value: dict[str, Any]) -> list[str]:
        return yaml.safe_dump(value, sort_keys=True, default_flow_style=False).splitlines(keepends=True)

    return "".join(difflib.unified_diff(dump(current), dump(desired), f"{label} (served)", f"{label} (declared)"))


def plan(endpoint: DeclaredEndpoint, view: dict[str, Any] | None, resolve: Resolve) -> Change:
    """What applying ``endpoint`` changes, given the gateway's view of it (None: it does not exist)."""
    desired = desired_config(endpoint, resolve)
    desired_ai = ai_gateway_view(endpoint.ai_gateway) if endpoint.ai_gateway is not None else {}
    if view is None:
        return Change(endpoint.name, "create", _diff({}, desired, endpoint.name), _diff({}, desired_ai, "ai_gateway"))
    config_diff = _diff(_comparable(view["config"]), desired, endpoint.name)
    ai_diff = _diff(view.get("ai_gateway") or {}, desired_ai, "ai_gateway")
    notes = []
    declared_tags = [t.model_dump(exclude_none=True) for t in endpoint.request.tags]
    if declared_tags != (view.get("tags") or []) or endpoint.request.description != view.get("description"):
        notes.append(f"endpoint {endpoint.name}: tags or description differ; they are set at creation only")
    failed = view["state"]["config_update"] == "UPDATE_FAILED"
    if failed and not config_diff:  # the config the gateway could not roll out: sent again, a new rollout
        notes.append(f"endpoint {endpoint.name}: its last rollout failed; sending its config again")
        config_diff = f"(endpoint {endpoint.name}: rolled out again after a failed rollout)\n"
    action: Action = "update" if config_diff or ai_diff else "unchanged"
    return Change(endpoint.name, action, config_diff, ai_diff, tuple(notes))


def config_body(endpoint: DeclaredEndpoint) -> dict[str, Any]:
    """The config update to send: what the file sets, and an extension block it leaves out as removed."""
    body = endpoint.request.config.model_dump(mode="json", exclude_unset=True)
    body.update({key: None for key in _EXTENSION_BLOCKS if key not in body})
    body["name"] = endpoint.name
    return body


def create_body(endpoint: DeclaredEndpoint) -> dict[str, Any]:
    body = endpoint.request.model_dump(mode="json", exclude_unset=True)
    body.pop("ai_gateway", None)  # set afterwards through its own route, as on an update
    return body


def _carry_out(api: GatewayApi, endpoint: DeclaredEndpoint, change: Change, timeout_s: float) -> None:
    if change.action == "create":
        api.create(create_body(endpoint))
    elif change.config_diff:
        api.put_config(endpoint.name, config_body(endpoint))
    if change.ai_gateway_diff:
        body = endpoint.request.ai_gateway if endpoint.request.ai_gateway is not None else {}
        api.put_ai_gateway(endpoint.name, body)
    settled = api.wait_settled(endpoint.name, timeout_s)
    if settled["state"]["config_update"] != "NOT_UPDATING":
        why = settled.get("state_message") or settled["state"]["config_update"]
        raise GatewayError(f"endpoint {endpoint.name}: the update did not roll out ({why})")


def registry_resolver(tracking_uri: str) -> Resolve:
    client = MlflowClient(tracking_uri)

    def resolve(model: str, alias: str) -> str:
        with answering(tracking_uri, f"resolving {model}@{alias}"):
            return str(versions.resolve(client, model, alias, alias=True).version)

    return resolve


@flow(name="apply")
def apply_endpoints(
    files: list[str],
    dry_run: bool = False,
    gateway_url: str | None = None,
    timeout_s: float = 600.0,
    registry_uri: str | None = None,
) -> list[dict[str, Any]]:
    """Create or update the gateway's endpoints to match ``files``; with ``dry_run``, only report the differences.
    Aliases are read in ``registry_uri``, the registry the gateway serves from (default: this region's)."""
    logger = get_run_logger()
    declared = read_endpoints([Path(f) for f in files])  # every file checked before anything changes
    resolve = registry_resolver(registry_uri or Settings.from_environ(os.environ).tracking_uri)
    api = GatewayApi.from_environ(os.environ, gateway_url)
    changes = []
    try:
        planned = []  # every endpoint planned (its aliases resolved) before any changes
        for endpoint in declared:
            view = api.find(endpoint.name)
            if view is not None and view["state"]["config_update"] == "IN_PROGRESS":
                view = api.wait_settled(endpoint.name, timeout_s)
            planned.append((endpoint, plan(endpoint, view, resolve)))
        for endpoint, change in planned:
            for note in change.notes:
                logger.warning(note)
            logger.info("endpoint %s: %s%s", endpoint.name, change.action, " (dry run)" if dry_run else "")
            for text in (change.config_diff, change.ai_gateway_diff):
                if text:
                    logger.info("%s", text)
            if change.changes and not dry_run:
                _carry_out(api, endpoint, change, timeout_s)
            changes.append(
                {
                    "endpoint": change.endpoint,
                    "action": change.action,
                    "applied": change.changes and not dry_run,
                    "diff": change.config_diff + change.ai_gateway_diff,
                    "notes": list(change.notes),
                }
            )
    finally:
        api.close()
    return changes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-f", "--file", dest="files", action="append", required=True, help="an endpoints file")
    parser.add_argument("--dry-run", action="store_true", help="print the differences, change nothing")
    parser.add_argument("--gateway-url", default=None)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="how long to wait for each rollout")
    parser.add_argument("--registry-uri", default=None, help="the registry the gateway serves from")
    args = parser.parse_args(argv)
    try:
        read_endpoints([Path(f) for f in args.files])  # refused here, before Prefect starts a run
    except EndpointFileError as exc:
        print(f"apply: {exc}", file=sys.stderr)
        return 2
    try:
        changes = apply_endpoints(args.files, args.dry_run, args.gateway_url, args.timeout_s, args.registry_uri)
    except (GatewayError, LookupError) as exc:
        print(f"apply: {exc}", file=sys.stderr)
        return 1
    for change in changes:
        dry = " (dry run: not applied)" if args.dry_run and change["action"] != "unchanged" else ""
        print(f"{change['endpoint']}: {change['action']}{dry}")
        if args.dry_run and change["diff"]:
            print(change["diff"], end="")
        for note in change["notes"]:
            print(f"  note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
