"""The train flow against a real MLflow registry on SQLite, run on the session's Prefect server."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient

from feature_repo import store as feature_store
from serving.registry import versions
from tests.world import MODEL_NAME


@pytest.fixture(scope="module")
def client(world):
    return MlflowClient(world.settings.tracking_uri)


def test_registered_version_carries_signature_feature_service_and_alias(world, client):
    version = client.get_model_version_by_alias(MODEL_NAME, "champion")
    assert str(version.version) == world.trained["version"]
    assert version.tags["feature_service"] == "fraud_v1"
    info = __import__("mlflow").models.get_model_info(f"models:/{MODEL_NAME}/{version.version}")
    assert info.metadata["feature_service"] == "fraud_v1"
    service = feature_store.feature_service(feature_store.open_store(world.home), "fraud_v1")
    assert info.signature.inputs.input_names() == feature_store.feature_names(service)
    assert info.saved_input_example_info is not None


def test_run_records_metrics_dataset_and_code_version(world, client):
    run = client.get_run(world.trained["run_id"])
    metrics = run.data.metrics
    assert metrics["eval_rows"] > 0 and metrics["train_rows"] > 0
    # the model learned: ranking well above the base rate of fraud on the later slice
    assert metrics["eval_pr_auc"] > 3 * metrics["eval_positive_rate"]
    assert metrics["eval_roc_auc"] > 0.6
    assert run.data.params["feature_service"] == "fraud_v1"
    assert run.data.tags["tollfree.git_commit"]
    inputs = run.inputs.dataset_inputs
    assert len(inputs) == 1 and inputs[0].dataset.digest and "transactions.parquet" in inputs[0].dataset.source
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id, "training")]
    assert artifacts == ["training/train.parquet"]


def test_missing_alias_is_named(world, client):
    with pytest.raises(LookupError, match="alias 'nope'") as err:
        versions.resolve(client, MODEL_NAME, "nope")
    assert MODEL_NAME in str(err.value)
