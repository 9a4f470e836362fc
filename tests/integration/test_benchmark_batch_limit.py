"""The batch benchmark's limit row scores what the model scores: same rows, same order, same values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from benchmarks.batch_limit import limit


def test_the_limit_writes_every_row_key_with_the_models_own_prediction(tmp_path):
    import mlflow
    from mlflow.models import infer_signature
    from sklearn.ensemble import GradientBoostingClassifier

    source = tmp_path / "features.parquet"
    rng = np.random.default_rng(5)
    features = pd.DataFrame(rng.normal(size=(1000, 4)), columns=["a", "b", "c", "d"])
    model = GradientBoostingClassifier(n_estimators=10, max_depth=2).fit(features, features.a + features.b > 0)
    features.assign(transaction_id=np.arange(1000)[::-1], event_timestamp=pd.Timestamp("2026-01-01")).to_parquet(source)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        experiment = mlflow.create_experiment("limit", artifact_location=str(tmp_path / "artifacts"))
        with mlflow.start_run(experiment_id=experiment):
            info = mlflow.sklearn.log_model(
                model,
                name="m",
                signature=infer_signature(features, model.predict_proba(features)),
                pyfunc_predict_fn="predict_proba",
                serialization_format="cloudpickle",
                pip_requirements=["scikit-learn"],  # given: inferring them loads the model in a process
            )
            out = limit(source, tmp_path / "out.parquet", info.model_uri, workers=2)
    finally:
        mlflow.set_tracking_uri(previous)
    written = pq.read_table(tmp_path / "out.parquet").to_pandas()
    assert out["rows"] == 1000 and out["seconds"] >= out["predict_s"] > 0
    assert written.transaction_id.tolist() == list(range(999, -1, -1))
    np.testing.assert_allclose(written.prediction, model.predict_proba(features)[:, 1])
