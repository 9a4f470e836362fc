"""Batch scoring and the drift flow on the real registry, feature store and Prefect harness."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import mlflow
import numpy as np
import pandas as pd
import pytest

from feature_repo import store as feature_store
from feature_repo import synthetic
from flows import training
from serving.inference_log import InferenceLogWriter, InferenceRecord
from tests.world import MODEL_NAME

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inline_validation")]


@pytest.fixture(scope="module")
def batch_input(world, tmp_path_factory):
    tx = synthetic.read_transactions(world.settings.data_dir)
    day = tx["event_timestamp"].max().floor("D") - pd.Timedelta(days=3)
    rows = tx[(tx["event_timestamp"] >= day) & (tx["event_timestamp"] < day + pd.Timedelta(days=1))]
    path = tmp_path_factory.mktemp("batch") / "input.parquet"
    rows[["transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount"]].to_parquet(path, index=False)
    return path


def test_batch_scores_every_row_like_pyfunc_and_reruns_idempotently(world, batch_input, tmp_path):
    from flows.batch_score import batch_score

    out = tmp_path / "scores"
    first = batch_score(
        input_path=str(batch_input), output=str(out), model_uri=f"models:/{MODEL_NAME}@champion", run_id="r1"
    )
    source = pd.read_parquet(batch_input)
    scored = pd.read_parquet(first["output"])
    assert len(scored) == len(source) == first["rows"]
    assert set(scored["transaction_id"]) == set(source["transaction_id"])
    assert scored["model_version"].eq(world.trained["version"]).all() and scored["run_id"].eq("r1").all()

    sample = source.sample(25, random_state=2)
    entities = training.entity_frame(sample)
    features = training.historical_features(feature_store.open_store(world.home), "fraud_v1", entities)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")
    expected = np.asarray(model.predict(features[list(model.metadata.get_input_schema().input_names())]))[:, 1]
    got = scored.set_index("transaction_id").loc[sample["transaction_id"], "prediction"].to_numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-9)

    again = batch_score(
        input_path=str(batch_input), output=str(out), model_uri=f"models:/{MODEL_NAME}@champion", run_id="r1"
    )
    assert pd.read_parquet(again["output"]).shape == scored.shape
    assert sorted(p.name for p in out.iterdir()) == ["run=r1"]  # replaced in place; no staging left behind


def test_batch_refuses_bad_input_before_writing(world, batch_input, tmp_path):
    from flows.batch_score import batch_score

    broken = tmp_path / "broken.parquet"
    pd.read_parquet(batch_input).drop(columns=["amount"]).to_parquet(broken)
    with pytest.raises(ValueError, match="amount"):
        batch_score(input_path=str(broken), output=str(tmp_path / "o1"), run_id="x")
    with pytest.raises(LookupError, match="nope"):
        batch_score(
            input_path=str(batch_input), output=str(tmp_path / "o2"), model_uri=f"models:/{MODEL_NAME}@nope", run_id="x"
        )
    with pytest.raises(FileNotFoundError, match=r"missing\.parquet"):
        batch_score(input_path=str(tmp_path / "missing.parquet"), output=str(tmp_path / "o3"), run_id="x")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists() and not (tmp_path / "o3").exists()


def _log_served(world, endpoint: str, rows: pd.DataFrame) -> None:
    """Log ``rows`` as served features, with the champion's real predictions on them."""
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}/{world.trained['version']}")
    predictions = np.asarray(model.predict(rows[list(model.metadata.get_input_schema().input_names())])).tolist()
    with InferenceLogWriter(world.settings.inference_log_dir) as log:
        for i, (row, prediction) in enumerate(zip(rows.to_dict(orient="records"), predictions)):
            log.record(
                InferenceRecord(
                    request_id=f"{endpoint}-{i}",
                    timestamp=datetime.now(UTC),
                    endpoint=endpoint,
                    served_entity=f"{MODEL_NAME}-champion",
                    model_version=world.trained["version"],
                    status_code=200,
                    latency_ms=1.0,
                    inputs=None,
                    served_features=json.dumps([row]),
                    outputs=json.dumps([prediction]),
                    error_code=None,
                    rows=1,
                )
            )


@pytest.fixture(scope="module")
def reference(world, tmp_path_factory):
    from serving.registry import versions

    path = versions.training_reference(
        world.settings.tracking_uri, MODEL_NAME, world.trained["version"], tmp_path_factory.mktemp("ref")
    )
    return pd.read_parquet(path)


def _register_endpoint(world, name: str) -> None:
    from serving.endpoints import spec, validation
    from serving.endpoints.store import EndpointStore

    config = validation.normalize_config(
        spec.EndpointCoreConfig(
            served_entities=[spec.ServedEntityInput(entity_name=MODEL_NAME, entity_alias="champion")]
        )
    )
    config.served_entities[0].resolved_version = world.trained["version"]
    EndpointStore(world.settings.state_url).create(
        spec.EndpointRecord(
            name=name,
            id=name,
            creator="test",
            created_ms=0,
            updated_ms=0,
            config=config,
            config_version=1,
            ready="READY",
            config_update="NOT_UPDATING",
            pending_config=None,
            ai_gateway=None,
            state_message=None,
        )
    )


@pytest.fixture
def scratch_endpoints(world):
    """Endpoint records the test registers by hand, removed afterwards (a gateway would restore them)."""
    from serving.endpoints.store import EndpointStore

    names = ["quiet", "shifted"]
    yield names
    store = EndpointStore(world.settings.state_url)
    for name in names:
        store.delete(name)


def test_drift_flow_is_quiet_on_training_like_traffic_and_names_a_shifted_feature(world, reference, scratch_endpoints):
    from flows.skew import skew

    names = [c for c in reference.columns if c.startswith(("cust_", "merch_", "amount_", "log_"))]
    same = reference[names].sample(400, random_state=5)
    _register_endpoint(world, "quiet")
    _log_served(world, "quiet", same)
    quiet = skew(endpoint="quiet")
    assert quiet["verdict"] == "clean" and quiet["findings"] == []

    shifted = same.copy()
    shifted["amount_to_mean_7d"] = shifted["amount_to_mean_7d"] * 6 + 3
    _register_endpoint(world, "shifted")
    _log_served(world, "shifted", shifted)
    with pytest.raises(RuntimeError, match="amount_to_mean_7d"):
        skew(endpoint="shifted")
    report = list((world.settings.reports_dir / "shifted").glob("drift-*.html"))
    assert len(report) == 1 and report[0].stat().st_size > 10_000
