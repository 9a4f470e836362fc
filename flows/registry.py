"""MLflow registry access the flows share: experiments with explicit artifact roots, aliases."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

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


class RegistryUnavailable(RuntimeError):
    """The MLflow tracking server did not answer (down, or unreachable)."""


def unreachable(exc: BaseException) -> bool:
    """Whether an MLflow error is a failed connection or a timeout, not an answer from the server."""
    import requests

    if not isinstance(exc, MlflowException):
        return False
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, requests.exceptions.RequestException):
        return True
    message = str(exc.message)
    return message.startswith("API request to") and ("failed with exception" in message or "failed with timeout" in message)


def server_address(tracking_uri: str) -> str:
    """The URI without credentials or path, fit for a message."""
    parts = urlsplit(tracking_uri)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}" if parts.hostname else parts.scheme


@contextmanager
def answering(tracking_uri: str, doing: str) -> Iterator[None]:
    """Turn an unreachable registry into one clear ``RegistryUnavailable`` naming the server and the step."""
    try:
        yield
    except MlflowException as exc:
        if not unreachable(exc):
            raise
        raise RegistryUnavailable(f"the MLflow registry at {server_address(tracking_uri)} did not answer while {doing}") from exc
