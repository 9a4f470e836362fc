"""Copying a model version from one registry to another (a region's), checked by digest before an alias moves.

A copy is a run in the target registry's ``tollfree-replicated`` experiment holding the version's artifacts
(MLmodel with its signature and input example, requirements, the model), the source run's parameters, metrics
and tags, and a version with every tag of the source version (gate results, lineage, ``feature_service``) plus:

- ``replication.source``: ``MODEL/VERSION@RUN_ID`` in the source registry, what makes a rerun find the copy;
- ``replication.digest``: sha256 over the source's artifact files (relative paths and bytes);
- ``replication.verified``: set to the same digest once the target's copy, downloaded again, has it.

Only a verified copy gets the alias. A copy that an interrupted run left unverified is verified (or, when its
files differ, deleted and made again) by the next run; a verified copy is never made twice.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from mlflow import MlflowClient
from mlflow.entities import Metric, Param
from mlflow.entities.model_registry import ModelVersion

SOURCE_TAG = "replication.source"
DIGEST_TAG = "replication.digest"
VERIFIED_TAG = "replication.verified"
EXPERIMENT = "tollfree-replicated"
_GATE_DETAIL = (".value", ".threshold", ".reason")
# MLflow writes this into a model's folder when it loads it by a models:/ URI (the registry's name and version
# there): not the model's, and different in every registry, so it is neither copied nor digested
REGISTRY_META = "registered_model_meta"


class ReplicationRefused(RuntimeError):
    """The source version may not be replicated (its gates did not pass), or its copy failed the digest check."""


@dataclass(frozen=True)
class Copied:
    """The outcome of one replication: the target's version, whether this run made it, where the alias went."""

    source_version: str
    target_version: str
    created: bool
    digest: str
    alias_moved_from: str | None


def tree_digest(folder: Path) -> str:
    """sha256 over every file under ``folder`` (MLflow's ``registered_model_meta`` aside): its path relative to
    ``folder`` and its bytes, in path order."""
    total = hashlib.sha256()
    for path in sorted(
        p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() != REGISTRY_META
    ):
        total.update(path.relative_to(folder).as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                total.update(block)
        total.update(b"\0")
    return total.hexdigest()


def gates_passed(tags: Mapping[str, str]) -> list[str]:
    """The gates recorded on a version (``gate.NAME``); ``ReplicationRefused`` naming any that did not pass."""
    gates = {
        k.removeprefix("gate."): v for k, v in tags.items() if k.startswith("gate.") and not k.endswith(_GATE_DETAIL)
    }
    if not gates:
        raise ReplicationRefused("the version has no gate results: run the promote flow on it first")
    failed = sorted(name for name, verdict in gates.items() if verdict != "pass")
    if failed:
        raise ReplicationRefused(f"the version's gates did not pass: {', '.join(failed)}")
    return sorted(gates)


def source_key(model: str, version: ModelVersion) -> str:
    return f"{model}/{version.version}@{version.run_id}"


def artifact_root_for(registry_uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: the server's choice for a tracking server, else beside the
    SQLite file (``mlartifacts``, as a tollfree state folder has it), never the caller's ./mlruns."""
    parsed = urlparse(registry_uri)
    if parsed.scheme in ("http", "https", "databricks"):
        return None
    if parsed.scheme.startswith("sqlite"):
        return (Path(parsed.path).parent / "mlartifacts").resolve().as_uri()
    raise ValueError(f"target registry {parsed.scheme or registry_uri!r}: use an http(s) tracking server or sqlite")


def download_version(client: MlflowClient, model: str, version: str, dest: Path) -> Path:
    """The version's artifact files, downloaded under ``dest``."""
    source = client.get_model_version_download_uri(model, version)
    from mlflow.artifacts import download_artifacts

    return Path(download_artifacts(artifact_uri=source, dst_path=str(dest), tracking_uri=client.tracking_uri))


def find_copy(target: MlflowClient, model: str, key: str) -> ModelVersion | None:
    """The target's version copied from ``key``, if a run made one (verified or not)."""
    copies = [v for v in target.search_model_versions(f"name='{model}'") if v.tags.get(SOURCE_TAG) == key]
    return max(copies, key=lambda v: int(v.version)) if copies else None


def _ensure_model(source: MlflowClient, target: MlflowClient, model: str) -> None:
    if target.search_registered_models(f"name='{model}'"):
        return
    registered = source.get_registered_model(model)
    target.create_registered_model(model, tags=dict(registered.tags), description=registered.description)


def _copy_run(
    source: MlflowClient, target: MlflowClient, version: ModelVersion, files: Path, uri: str
) -> tuple[str, str]:
    """A run in the target holding the files and the source run's parameters, metrics and tags: its id and the
    files' URI."""
    found = target.get_experiment_by_name(EXPERIMENT)
    experiment = found.experiment_id if found else target.create_experiment(EXPERIMENT, artifact_root_for(uri))
    origin = source.get_run(str(version.run_id))
    tags = {k: v for k, v in origin.data.tags.items() if not k.startswith("mlflow.")}
    tags.update(
        {
            "mlflow.runName": f"replica of {version.name} v{version.version}",
            "replication.source_run": str(version.run_id),
        }
    )
    run = target.create_run(experiment, tags=tags)
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in origin.data.params.items()]
    at_ms = origin.info.end_time or origin.info.start_time  # the latest values, when the source run logged them
    metrics = [Metric(k, v, at_ms, 0) for k, v in origin.data.metrics.items()]
    for start in range(0, max(len(params), len(metrics), 1), 100):
        target.log_batch(run_id, metrics=metrics[start : start + 100], params=params[start : start + 100])
    target.log_artifacts(run_id, str(files), "model")
    target.set_terminated(run_id)
    return run_id, f"{run.info.artifact_uri}/model"


def _verify(target: MlflowClient, copy: ModelVersion, digest: str) -> bool:
    with tempfile.TemporaryDirectory() as scratch:
        return tree_digest(download_version(target, copy.name, str(copy.version), Path(scratch))) == digest


def replicate_version(
    source: MlflowClient, target: MlflowClient, target_uri: str, model: str, version: ModelVersion
) -> tuple[ModelVersion, bool, str]:
    """The target's verified copy of ``version`` (made, or found), whether this call made it, and its digest."""
    key = source_key(model, version)
    with tempfile.TemporaryDirectory() as scratch:
        files = download_version(source, model, str(version.version), Path(scratch))
        (files / REGISTRY_META).unlink(missing_ok=True)
        digest = tree_digest(files)
        copy = find_copy(target, model, key)
        if copy is not None and copy.tags.get(VERIFIED_TAG) == digest:
            return copy, False, digest
        if copy is not None and copy.tags.get(DIGEST_TAG) == digest and _verify(target, copy, digest):
            target.set_model_version_tag(model, str(copy.version), VERIFIED_TAG, digest)
            return target.get_model_version(model, str(copy.version)), False, digest
        if copy is not None:  # a copy whose files differ from the source's: made again
            target.delete_model_version(model, str(copy.version))
        _ensure_model(source, target, model)
        run_id, artifact_uri = _copy_run(source, target, version, files, target_uri)
    tags = {**version.tags, SOURCE_TAG: key, DIGEST_TAG: digest}
    tags.pop(VERIFIED_TAG, None)
    made = target.create_model_version(model, artifact_uri, run_id=run_id, tags=tags, description=version.description)
    if not _verify(target, made, digest):
        raise ReplicationRefused(f"the copy of {model} v{version.version} in the target does not match its digest")
    target.set_model_version_tag(model, str(made.version), VERIFIED_TAG, digest)
    return target.get_model_version(model, str(made.version)), True, digest
