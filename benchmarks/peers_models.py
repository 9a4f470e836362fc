"""The peers benchmark's models and requests: each model fitted once a run and registered in MLflow (logged
without and with an input example), its sample rows and their in-process predictions, and a request of N rows
in each server's native format."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import log
from benchmarks.peer_wire import predictions_of, request_for
from benchmarks.peers_report import OURS

SEED = 20263
FEATURES = 20
TRAIN_ROWS = 4000
MODELS = {
    "light": "GBDT 100 trees, depth 3, 20 float columns",
    "heavy": "GBDT 500 trees, depth 6, 20 float columns",
    "pipeline": "scaler on 19 floats + one-hot 'cat', GBDT 100 trees depth 3",
}


def fit(key: str, rng: np.random.Generator) -> tuple[Any, Any, list[str]]:
    """The estimator, a frame of its training inputs, its input columns."""
    import pandas as pd
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    x = rng.normal(size=(TRAIN_ROWS, FEATURES))
    y = ((x[:, 0] + 0.5 * x[:, 1] * x[:, 2] - x[:, 3] + rng.normal(scale=0.5, size=TRAIN_ROWS)) > 0).astype(int)
    columns = [f"f{i}" for i in range(FEATURES)]
    frame = pd.DataFrame(x, columns=columns)
    trees, depth = (500, 6) if key == "heavy" else (100, 3)
    gbdt = GradientBoostingClassifier(n_estimators=trees, max_depth=depth, random_state=SEED)
    if key != "pipeline":
        return gbdt.fit(frame, y), frame, columns
    columns = [*columns[:-1], "cat"]
    frame = frame.iloc[:, :-1].assign(cat=np.where(x[:, -1] > 0.5, "a", np.where(x[:, -1] > -0.5, "b", "c")))
    y = np.where(frame["cat"] == "a", 1 - y, y)
    prep = ColumnTransformer(
        [("num", StandardScaler(), columns[:-1]), ("cat", OneHotEncoder(handle_unknown="ignore"), ["cat"])]
    )
    return Pipeline([("prep", prep), ("gbdt", gbdt)]).fit(frame, y), frame, columns


def pip_requirements() -> list[str]:
    import cloudpickle
    import mlflow
    import sklearn

    return [
        f"mlflow=={mlflow.__version__}",
        f"scikit-learn=={sklearn.__version__}",
        f"cloudpickle=={cloudpickle.__version__}",
    ]


def register(key: str, estimator: Any, frame: Any, *, example: bool) -> dict[str, str]:
    import mlflow
    from mlflow.models import infer_signature

    name = f"peers-{key}{'-example' if example else ''}"
    with mlflow.start_run():
        # cloudpickle, as benchmarks/serving.py logs its models (skops asks for the tree types to be trusted)
        info = mlflow.sklearn.log_model(
            estimator,
            name="model",
            signature=infer_signature(frame, estimator.predict(frame)),
            input_example=frame.iloc[:5] if example else None,
            registered_model_name=name,
            serialization_format="cloudpickle",
            pip_requirements=pip_requirements(),
        )
    return {"name": name, "version": str(info.registered_model_version)}


def prepare(keys: list[str], home: Path) -> dict[str, dict[str, Any]]:
    """Per model: the estimator as a joblib file, its MLflow registrations, sample rows and their predictions."""
    import joblib
    import mlflow

    experiment = mlflow.create_experiment("bench-peers", artifact_location=(home / "artifacts").resolve().as_uri())
    mlflow.set_experiment(experiment_id=experiment)
    rng = np.random.default_rng(SEED)
    out = {}
    for key in keys:
        began = time.monotonic()
        estimator, frame, columns = fit(key, rng)
        path = home / f"{key}.joblib"
        joblib.dump(estimator, path)
        rows = frame.sample(32, random_state=SEED).reset_index(drop=True)
        out[key] = {
            "estimator": estimator,
            "path": path,
            "columns": columns,
            "frame": rows,
            "plain": register(key, estimator, frame, example=False),
            "example": register(key, estimator, frame, example=True),
            "expected": [int(v) for v in estimator.predict(rows)],
            "in_process_ms": in_process_p50(estimator, rows.iloc[:1]),
        }
        log(f"model {key}: {MODELS[key]}, fitted and registered in {time.monotonic() - began:.1f}s")
    return out


def in_process_p50(estimator: Any, row: Any, calls: int = 500) -> float:
    """The p50 in ms of the estimator's own predict on one row as a DataFrame, in this process, after warm-up."""
    took = []
    for i in range(calls + 50):
        started = time.perf_counter()
        estimator.predict(row)
        if i >= 50:
            took.append(time.perf_counter() - started)
    return float(np.median(took) * 1000)


def request(kind: str, model: dict[str, Any], n: int) -> tuple[str, str, dict[str, str]]:
    """(path, body, headers) of a request with the first ``n`` sample rows, in ``kind``'s native format."""
    rows = model["frame"].iloc[:n]
    if kind in OURS:
        split = json.loads(rows.to_json(orient="split", index=False))
        return "", json.dumps({"dataframe_split": split}), {}
    records = model["columns"][-1] == "cat"
    data = rows.to_dict(orient="records") if records else rows.to_numpy().tolist()
    return request_for(kind.partition("-")[0], data)


def predictions(kind: str, answer: Any) -> list[Any]:
    if kind in OURS:
        return list(answer["predictions"])
    return list(predictions_of(kind.partition("-")[0], answer))
