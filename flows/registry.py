"""MLflow registry access the flows share: experiments with explicit artifact roots, aliases."""

from __future__ import annotations

from pathlib import Path

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.entities.model_registry import ModelVersion


def ensure_experiment(client: MlflowClient, name: str, artifact_root: Path) -> str:
    """The experiment's id, created with its artifacts under the state folder (never ./mlruns)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=artifact_root.resolve().as_uri())


def version_by_alias(client: MlflowClient, model_name: str, alias: str) -> ModelVersion:
    """The version holding ``alias``, or a LookupError naming the model and the alias."""
    try:
        return client.get_model_version_by_alias(model_name, alias)
    except MlflowException as exc:
        raise LookupError(f"registered model {model_name!r} has no version with alias {alias!r}") from exc


def model_uri(model_name: str, alias: str) -> str:
    return f"models:/{model_name}@{alias}"


def training_reference(tracking_uri: str, model_name: str, version: str, dest: Path) -> Path:
    """Download the training frame logged with a version's run (``training/train.parquet``)."""
    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(model_name, version).run_id
    dest.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, "training/train.parquet", str(dest)))
