"""How the flows tell an unreachable MLflow registry from an answer it gave, and what they say about it."""

from __future__ import annotations

import pytest
import requests
from mlflow.exceptions import MlflowException

from serving.registry.errors import RegistryUnavailable, answering, server_address, unreachable


def _connection_failure() -> MlflowException:
    try:
        try:
            raise requests.exceptions.ConnectionError("connection refused")
        except requests.exceptions.ConnectionError as exc:
            raise MlflowException(f"API request to http://127.0.0.1:9/api failed with exception {exc}")  # noqa: B904 - as MLflow raises it
    except MlflowException as wrapped:  # MLflow raises it inside the except block: the cause is the context
        return wrapped


def test_a_failed_connection_is_unreachable_and_an_answer_is_not():
    assert unreachable(_connection_failure())
    assert not unreachable(MlflowException("RESOURCE_DOES_NOT_EXIST: no such model"))
    assert not unreachable(ValueError("API request to x failed with exception y"))


def test_the_address_in_messages_carries_no_credentials_or_path():
    assert server_address("https://user:secret@mlflow.internal:5000/prefix?x=1") == "https://mlflow.internal:5000"
    assert server_address("http://127.0.0.1:9") == "http://127.0.0.1:9"
    assert server_address("sqlite:////tmp/mlflow.db") == "sqlite"


def test_answering_names_the_server_and_the_step_and_lets_other_errors_through():
    with (
        pytest.raises(RegistryUnavailable, match=r"registry at https://mlflow\.internal did not answer while gating m"),
        answering("https://u:secret@mlflow.internal/x", "gating m"),
    ):
        raise _connection_failure()
    with pytest.raises(MlflowException, match="no such model"), answering("http://127.0.0.1:9", "gating m"):
        raise MlflowException("no such model")


def test_batch_scoring_and_the_gateway_name_a_registry_that_does_not_answer(monkeypatch):
    from mlflow import MlflowClient

    from serving.batch.job import resolve_model
    from serving.endpoints.resolver import mlflow_resolver
    from serving.protocol.errors import ApiError

    def down(*_args, **_kwargs):
        raise _connection_failure()

    monkeypatch.setattr(MlflowClient, "get_model_version_by_alias", down)
    monkeypatch.setattr(MlflowClient, "get_model_version", down)
    with pytest.raises(
        RegistryUnavailable, match=r"at http://127\.0\.0\.1:9 did not answer while resolving models:/fraud@champion"
    ):
        resolve_model("models:/fraud@champion", "http://127.0.0.1:9")
    with pytest.raises(ApiError) as refused:
        mlflow_resolver("http://127.0.0.1:9")("fraud", "3", None)
    assert refused.value.status_code == 503 and "did not answer" in refused.value.message


def test_the_batch_cli_exits_1_naming_a_registry_that_does_not_answer(monkeypatch, capsys, tmp_path):
    import flows.batch_score as cli

    def down(**_kwargs):
        raise RegistryUnavailable(
            "the MLflow registry at http://127.0.0.1:9 did not answer while resolving models:/m@champion"
        )

    monkeypatch.setattr(cli, "batch_score", down)
    code = cli.main(["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "out")])
    assert code == 1
    assert "batch scoring failed: the MLflow registry at http://127.0.0.1:9 did not answer" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
