"""Replicate flow: the version an alias names in this region's registry, copied into another region's registry.

``python -m flows.replicate --model fraud --alias champion --to URI [--to URI ...] [--from URI]``

For each target (``serving.registry.replication``): the version's gate results are checked first (a version whose
gates did not pass, or that has none, is refused and nothing is copied); the version is copied with its
artifacts, tags and run, the copy downloaded again and compared by digest, and only then the alias moved there
(``champion`` as a promotion does: the old champion becomes ``previous``). Replicating a version that was copied
already creates nothing; a run that was interrupted is completed by the next.

The target region's endpoints follow the alias when its endpoints file is applied there (``flows.apply``), which
its own schedule does. The deployment ``replicate/after-promotion-MODEL`` runs this flow after every promote, canary
or rollback run when ``TOLLFREE_REPLICATE_TO`` names the other regions' registries.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task

from flows.promote import MLFLOW_RETRIES
from serving.registry import lifecycle, versions
from serving.registry.errors import answering
from serving.registry.replication import Copied, ReplicationRefused, gates_passed, replicate_version
from serving.settings import Settings

TARGETS_ENV = "TOLLFREE_REPLICATE_TO"  # comma-separated registry URIs of the other regions


def targets_from(value: str) -> list[str]:
    return [uri.strip() for uri in value.split(",") if uri.strip()]


def _move_alias(target: MlflowClient, model: str, alias: str, version: str, source_version: str) -> str | None:
    current = versions.aliases(target, model).get(alias)
    if current == version:
        return None
    if alias == lifecycle.CHAMPION:
        why = f"replicated from v{source_version} of the source registry"
        return lifecycle.make_champion(target, model, version, who=getpass.getuser(), why=why, now=datetime.now(UTC))
    target.set_registered_model_alias(model, alias, version)
    return current


@task(**MLFLOW_RETRIES)
def gated_version(source_uri: str, model: str, alias: str) -> str:
    """The version ``alias`` names in the source registry, with its gate results read."""
    with answering(source_uri, f"reading {model}@{alias}"):
        version = versions.resolve(MlflowClient(source_uri, source_uri), model, alias, alias=True)
    return str(version.version)


@task(**MLFLOW_RETRIES)
def copy_to(source_uri: str, target_uri: str, model: str, alias: str, version_number: str) -> Copied:
    """One target: the version copied (or found) and verified, then the alias moved there."""
    source = MlflowClient(source_uri, source_uri)
    target = MlflowClient(target_uri, target_uri)
    with answering(source_uri, f"reading {model} v{version_number}"):
        version = source.get_model_version(model, version_number)
    with answering(target_uri, f"replicating {model} v{version.version}"):
        copy, created, digest = replicate_version(source, target, target_uri, model, version)
        moved_from = _move_alias(target, model, alias, str(copy.version), str(version.version))
    return Copied(str(version.version), str(copy.version), created, digest, moved_from)


@flow(name="replicate")
def replicate(
    model_name: str = "fraud", alias: str = "champion", to: list[str] | None = None, source_uri: str | None = None
) -> list[dict[str, Any]]:
    """Copy ``model_name@alias`` into every registry in ``to`` (default: ``TOLLFREE_REPLICATE_TO``)."""
    logger = get_run_logger()
    source_uri = source_uri or Settings.from_environ(os.environ).tracking_uri
    targets = to if to is not None else targets_from(os.environ.get(TARGETS_ENV, ""))
    if not targets:
        raise ValueError(f"no target registry: pass --to or set {TARGETS_ENV}")
    if source_uri in targets:
        raise ValueError("a target registry is the source registry")
    version = gated_version(source_uri, model_name, alias)
    with answering(source_uri, f"reading the gates of {model_name} v{version}"):
        tags = MlflowClient(source_uri, source_uri).get_model_version(model_name, version).tags
    gates_passed(tags)  # refused before anything is copied anywhere
    out = []
    for target_uri in targets:
        done = copy_to(source_uri, target_uri, model_name, alias, version)
        what = "copied as" if done.created else "already there as"
        moved = f"{alias} moved from v{done.alias_moved_from}" if done.alias_moved_from else f"{alias} set"
        logger.info(
            "%s v%s %s v%s (sha256 %s); %s", model_name, done.source_version, what, done.target_version,
            done.digest[:12], moved,
        )  # fmt: skip
        out.append({"target": target_uri, **asdict(done)})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--alias", default="champion")
    parser.add_argument("--to", action="append", default=None, help="a target registry URI (repeatable)")
    parser.add_argument("--from", dest="source", default=None, help="the source registry (default: this region's)")
    args = parser.parse_args(argv)
    try:
        done = replicate(args.model, args.alias, args.to, args.source)
    except (ReplicationRefused, LookupError, ValueError) as exc:
        print(f"replicate: {exc}", file=sys.stderr)
        return 1
    for row in done:
        state = "created" if row["created"] else "existing"
        print(f"{row['target']}: v{row['source_version']} -> v{row['target_version']} ({state}, {row['digest'][:12]})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
