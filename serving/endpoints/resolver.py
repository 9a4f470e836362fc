"""Alias and version -> registry version, as the endpoints API resolves a served entity's model (``api``)."""

from __future__ import annotations

from collections.abc import Callable

from serving.protocol.errors import invalid_parameter, unavailable
from serving.registry import versions

VersionResolver = Callable[[str, "str | None", "str | None"], str]


def mlflow_resolver(tracking_uri: str) -> VersionResolver:
    """Resolve (model, version, alias) to a registry version; 400 naming the model if it is not there, 503
    if the registry does not answer."""

    def resolve(model_name: str, version: str | None, alias: str | None) -> str:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        try:
            found = versions.resolve(MlflowClient(tracking_uri), model_name, alias or str(version), alias=bool(alias))
        except LookupError as exc:
            raise invalid_parameter(str(exc)) from exc
        except MlflowException as exc:  # resolve lets through only a registry that did not answer
            raise unavailable(f"the MLflow registry did not answer while resolving {model_name}") from exc
        return str(found.version)

    return resolve
