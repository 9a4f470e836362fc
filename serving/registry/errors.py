"""An MLflow registry that did not answer, told apart from an answer it gave, and named in one error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit


class RegistryUnavailable(RuntimeError):
    """The MLflow tracking server did not answer (down, or unreachable)."""


def unreachable(exc: BaseException) -> bool:
    """Whether an MLflow error is a failed connection or a timeout, not an answer from the server."""
    import requests
    from mlflow.exceptions import MlflowException

    if not isinstance(exc, MlflowException):
        return False
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, requests.exceptions.RequestException):
        return True
    message = str(exc.message)
    return message.startswith("API request to") and (
        "failed with exception" in message or "failed with timeout" in message
    )


def server_address(tracking_uri: str) -> str:
    """The URI without credentials or path, fit for a message."""
    parts = urlsplit(tracking_uri)
    return (
        f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}" if parts.hostname else parts.scheme
    )


@contextmanager
def answering(tracking_uri: str, doing: str) -> Iterator[None]:
    """Turn an unreachable registry into one clear ``RegistryUnavailable`` naming the server and the step."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as exc:
        if not unreachable(exc):
            raise
        raise RegistryUnavailable(
            f"the MLflow registry at {server_address(tracking_uri)} did not answer while {doing}"
        ) from exc
