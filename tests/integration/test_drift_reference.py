"""Which reference drift compares a version with, on the real registry (MLflow on SQLite) and a real
inference log: the training frame when the run has one; else a dataset pinned by name (logged with
``mlflow.log_input``) or a pinned window of served traffic; else the version's first served window."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import infer_signature
from sklearn.linear_model import LinearRegression

from flows.served_data import reference_for
from serving.endpoints.monitoring_settings import MonitoringConfig
from serving.inference_log import InferenceLogWriter, InferenceRecord
from serving.registry import versions
from tests.world import MODEL_NAME

MODEL, ENDPOINT, ENTITY = "reference_own", "reference-ep", "reference_own-1"


@pytest.fixture(scope="module")
def own(world, tmp_path_factory) -> str:  # type: ignore[no-untyped-def]
    """A model of the user's own, with a dataset named ``holdout`` logged on its run from a parquet file."""
    client = MlflowClient(world.settings.tracking_uri)
    experiment = versions.ensure_experiment(client, "reference-own", world.settings.artifacts_dir)
    x = pd.DataFrame(np.random.default_rng(0).normal(size=(50, 2)), columns=["a", "b"])
    path = tmp_path_factory.mktemp("holdout") / "holdout.parquet"
    x.to_parquet(path, index=False)
    with mlflow.start_run(experiment_id=experiment):
        mlflow.log_input(mlflow.data.from_pandas(x, source=str(path), name="holdout"), context="evaluation")
        model = LinearRegression().fit(x, x["a"])
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            signature=infer_signature(x),
            registered_model_name=MODEL,
            pip_requirements=["scikit-learn"],  # given: inferring them loads the model in a process
        )
    return str(info.registered_model_version)


def _served(world, requests: int, start: datetime) -> None:  # type: ignore[no-untyped-def]
    with InferenceLogWriter(world.settings.inference_log_dir) as log:
        for i in range(requests):
            log.record(
                InferenceRecord(
                    request_id=f"ref-{i}",
                    timestamp=start + timedelta(seconds=i),
                    endpoint=ENDPOINT,
                    served_entity=ENTITY,
                    model_version="1",
                    status_code=200,
                    latency_ms=2.0,
                    served_features=None,
                    error_code=None,
                    rows=1,
                    inputs=json.dumps({"dataframe_records": [{"a": float(i), "b": 1.0}]}),
                    outputs=json.dumps([float(i)]),
                )
            )


def _reference(world, model: str, version: str, monitoring: dict):  # type: ignore[no-untyped-def]
    client = MlflowClient(world.settings.tracking_uri)
    return reference_for(
        world.settings,
        client,
        ENDPOINT,
        ENTITY,
        model,
        version,
        MonitoringConfig.model_validate(monitoring),
        datetime.now(UTC),
    )


def test_the_training_frame_comes_first(world):
    champion = MlflowClient(world.settings.tracking_uri).get_model_version_by_alias(MODEL_NAME, "champion")
    ref = _reference(world, MODEL_NAME, champion.version, {"reference": {"dataset": "holdout"}})
    assert ref.described.startswith("training frame logged on run") and len(ref.frame) > 100


def test_a_dataset_pinned_by_name_is_loaded_from_its_source_and_an_unknown_name_is_named(world, own):
    ref = _reference(world, MODEL, own, {"reference": {"dataset": "holdout"}})
    assert ref.described.startswith("dataset 'holdout' logged on run") and list(ref.frame.columns) == ["a", "b"]
    assert len(ref.frame) == 50 and ref.served is None
    with pytest.raises(LookupError, match=r"no dataset named 'nope'.*holdout"):
        _reference(world, MODEL, own, {"reference": {"dataset": "nope"}})


def test_without_either_the_first_served_window_then_a_pinned_window(world, own):
    start = datetime.now(UTC) - timedelta(minutes=30)
    _served(world, 40, start)
    first = _reference(world, MODEL, own, {"reference": {"first_requests": 25}})
    assert first.served is not None and first.served.requests == 25 and len(first.frame) == 25
    assert first.scored and "prediction" in first.frame.columns  # its own served predictions
    assert first.described.startswith("first served window: 25 requests")
    pinned = _reference(
        world,
        MODEL,
        own,
        {
            "reference": {
                "start": (start + timedelta(seconds=10)).isoformat(),
                "end": (start + timedelta(seconds=20)).isoformat(),
            }
        },
    )
    assert pinned.served.requests == 10 and sorted(pinned.frame["a"]) == [float(i) for i in range(10, 20)]
    filling = _reference(world, MODEL, own, {"reference": {"first_requests": 1000}})
    assert filling.frame is None and "filling until 1000 requests" in filling.described  # under an hour, 40 requests
