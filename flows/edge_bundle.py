"""Edge bundle flow: the version an alias names, converted to ONNX, verified, signed and logged with the version.

``python -m flows.edge_bundle --model fraud --alias champion [--tolerance 1e-4] [--key FILE] [--out FILE]``

The version's gates must have passed (as for replication). The conversion and its check are
``serving.edge.bundling``'s: a model that cannot be converted, or whose ONNX answers differ from the original's on
the version's held-out rows (``evaluation/eval.parquet``, logged by the train flow) by more than the tolerance, is
refused, naming the step. The bundle is signed with ``--key`` (default ``$TOLLFREE_HOME/edge/signing-key.pem``,
made on first use with ``signing-key.pub.pem`` beside it: the file devices are given), logged as an artifact of
the version's run under ``edge/``, and the version tagged: ``edge.bundle`` (the artifact path), ``edge.sha256``,
``edge.tolerance_measured``. A version bundled already is left as it is (``--force`` bundles it again).

The deployment ``edge-bundle/after-promotion-MODEL`` runs this flow after every promote, canary or rollback run
when ``TOLLFREE_EDGE_BUNDLES`` is ``1``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task

from feature_repo import store as feature_store
from flows.promote import MLFLOW_RETRIES
from serving.edge import bundling, signing
from serving.edge.bundle_files import BUNDLE_TAG, MEASURED_TAG, SHA_TAG
from serving.registry import versions
from serving.registry.errors import answering
from serving.registry.replication import ReplicationRefused, gates_passed
from serving.settings import Settings

ENABLED_ENV = "TOLLFREE_EDGE_BUNDLES"  # "1": bundle every promoted version (the deployment's trigger)
ARTIFACT_DIR = "edge"


@task(**MLFLOW_RETRIES)
def version_of(tracking_uri: str, model: str, alias: str) -> dict[str, Any]:
    """The version ``alias`` names, its tags and its signature's inputs; a missing alias is returned as
    ``missing``, not raised, so that the task's retries (for a registry that did not answer) do not repeat it."""
    from mlflow.models import get_model_info

    client = MlflowClient(tracking_uri, tracking_uri)
    try:
        with answering(tracking_uri, f"reading {model}@{alias}"):
            version = versions.resolve(client, model, alias, alias=True)
    except LookupError as exc:
        return {"missing": str(exc)}
    uri = f"models:/{model}/{version.version}"
    signature = get_model_info(uri).signature
    schema = signature.inputs if signature is not None else None
    return {
        "version": str(version.version),
        "run_id": version.run_id,
        "uri": uri,
        "tags": dict(version.tags),
        "inputs": schema.input_names() if schema is not None else None,
        "schema": schema.to_dict() if schema is not None else None,
        "feature_service": version.tags.get("feature_service"),
        "bundled": version.tags.get(BUNDLE_TAG),
        "sha256": version.tags.get(SHA_TAG),
    }


def gated(found: dict[str, Any], model: str) -> dict[str, Any]:
    """``found`` when it can be bundled: its gates passed and its signature names its inputs."""
    if "missing" in found:
        raise LookupError(found["missing"])
    gates_passed(found["tags"])
    if found["inputs"] is None:
        raise ReplicationRefused(f"{model} v{found['version']} has no input signature: its columns are unknown")
    return found


@task(**MLFLOW_RETRIES)
def held_out(tracking_uri: str, run_id: str) -> pd.DataFrame:
    with tempfile.TemporaryDirectory() as tmp:
        path = MlflowClient(tracking_uri, tracking_uri).download_artifacts(run_id, "evaluation/eval.parquet", tmp)
        return pd.read_parquet(path)


def _features(home: Path, service_name: str | None) -> dict[str, Any]:
    if not service_name:
        return {}
    store = feature_store.open_store(home)
    return {
        "service": service_name,
        "views": feature_store.service_views(store, feature_store.feature_service(store, service_name)),
    }


@task(**MLFLOW_RETRIES)
def log_bundle(tracking_uri: str, model: str, found: dict[str, Any], built: bundling.Built) -> str:
    client = MlflowClient(tracking_uri, tracking_uri)
    client.log_artifact(found["run_id"], str(built.archive), ARTIFACT_DIR)
    path = f"{ARTIFACT_DIR}/{built.archive.name}"
    client.set_model_version_tag(model, found["version"], BUNDLE_TAG, path)
    client.set_model_version_tag(model, found["version"], SHA_TAG, built.sha256)
    client.set_model_version_tag(
        model, found["version"], MEASURED_TAG, f"{built.manifest['tolerance']['measured']:.3g}"
    )
    return path


@flow(name="edge-bundle")
def edge_bundle(
    model_name: str = "fraud",
    alias: str = "champion",
    tolerance: float = bundling.DEFAULT_TOLERANCE,
    key_path: str | None = None,
    out: str | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Bundle ``model_name@alias`` for devices; the artifact path, digest and tolerance measured."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    found = gated(version_of(settings.tracking_uri, model_name, alias), model_name)
    if found["bundled"] and not force:
        logger.info("%s v%s has its bundle already: %s", model_name, found["version"], found["bundled"])
        return {"version": found["version"], "artifact": found["bundled"], "sha256": found["sha256"], "measured": None}
    rows = held_out(settings.tracking_uri, found["run_id"])
    key = signing.signing_key(Path(key_path) if key_path else signing.default_key_path(settings.home), create=True)
    name = f"{model_name}-{found['version']}.tar"
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(out) if out else Path(tmp) / name
        built = bundling.build(
            found["uri"], model_name, found["version"], found["inputs"], rows, key, archive, tolerance,
            _features(settings.home, found["feature_service"]), found["schema"],
        )  # fmt: skip
        path = log_bundle(settings.tracking_uri, model_name, found, built)
    measured = built.manifest["tolerance"]["measured"]
    logger.info(
        "%s v%s bundled: %s (sha256 %s), largest difference %.3g on %d held-out rows (allowed %.3g)",
        model_name, found["version"], path, built.sha256[:12], measured, len(rows), tolerance,
    )  # fmt: skip
    return {"version": found["version"], "artifact": path, "sha256": built.sha256, "measured": measured}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--alias", default="champion")
    parser.add_argument("--tolerance", type=float, default=bundling.DEFAULT_TOLERANCE)
    parser.add_argument("--key", default=None, help="the Ed25519 private key (PEM) to sign with")
    parser.add_argument("--out", default=None, help="also keep the bundle file here")
    parser.add_argument("--force", action="store_true", help="bundle the version again even if it has a bundle")
    args = parser.parse_args(argv)
    if not args.tolerance > 0:
        parser.error("--tolerance must be positive")
    try:
        done = edge_bundle(args.model, args.alias, args.tolerance, args.key, args.out, args.force)
    except (bundling.ConversionRefused, ReplicationRefused, LookupError, ValueError, FileNotFoundError) as exc:
        print(f"edge_bundle: {exc}", file=sys.stderr)
        return 1
    measured = "bundled before" if done["measured"] is None else f"largest difference {done['measured']:.3g}"
    what = f"{done['artifact']} sha256 {done['sha256']} ({measured})"
    print(f"{args.model} v{done['version']}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
