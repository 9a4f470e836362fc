"""Reading the MLflow registry: a model version from a version number or an alias, a model's aliases,
a version's training data, and the experiments runs are logged to.

``resolve`` is the one place a reference becomes a version: the gateway's endpoints, batch scoring,
lineage and the promote and canary flows all call it. MLflow is imported when a function runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from serving.registry.errors import unreachable

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities.model_registry import ModelVersion


def resolve(client: MlflowClient, model: str, ref: str | int, *, alias: bool | None = None) -> ModelVersion:
    """The version of ``model`` that ``ref`` names: a version number or an alias.

    A string of digits is a version number and anything else an alias, unless ``alias`` says which
    (MLflow allows an alias of digits alone). A reference the registry does not hold raises one
    ``LookupError`` naming the model and the reference; a registry that did not answer raises MLflow's
    own error, which ``errors.answering`` turns into ``RegistryUnavailable``.
    """
    from mlflow.exceptions import MlflowException

    ref = str(ref)
    by_alias = not ref.isdigit() if alias is None else alias
    try:
        return client.get_model_version_by_alias(model, ref) if by_alias else client.get_model_version(model, ref)
    except MlflowException as exc:
        if unreachable(exc):
            raise
        what = f"version with alias {ref!r}" if by_alias else f"version {ref!r}"
        raise LookupError(f"registered model {model!r} has no {what}") from exc


def aliases(client: MlflowClient, model: str) -> dict[str, str]:
    """alias -> version for a registered model."""
    return {name: str(version) for name, version in client.get_registered_model(model).aliases.items()}


def model_uri(model_name: str, alias: str) -> str:
    return f"models:/{model_name}@{alias}"


def training_reference(tracking_uri: str, model_name: str, version: str, dest: Path) -> Path:
    """Download the training frame logged with a version's run (``training/train.parquet``)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    run_id = client.get_model_version(model_name, version).run_id
    dest.mkdir(parents=True, exist_ok=True)
    return Path(client.download_artifacts(run_id, "training/train.parquet", str(dest)))


def ensure_experiment(client: MlflowClient, name: str, artifact_root: Path) -> str:
    """The experiment's id, created with its artifacts under the state folder (never ./mlruns)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    return client.create_experiment(name, artifact_location=artifact_root.resolve().as_uri())


def state_experiment(name: str) -> str:
    """``ensure_experiment`` on the tracking server and state folder the environment names (``TOLLFREE_HOME``,
    ``MLFLOW_TRACKING_URI``): for code that logs a model outside a flow. MLflow's default experiment on a SQLite
    registry keeps its artifacts in ./mlruns, under whatever folder the caller runs in."""
    import os

    from mlflow import MlflowClient

    from serving.settings import Settings

    return ensure_experiment(MlflowClient(), name, Settings.from_environ(os.environ).artifacts_dir)
