"""The served data the drift flow compares, and what it compares it with.

``served_rows`` turns inference-log records into one row per served row (the features the model was fed,
or the request's own columns for a model without a FeatureService) with its prediction. ``reference_for``
picks a version's reference, in this order: the training frame logged on its run; else what the
endpoint's ``monitoring.reference`` pins (a dataset logged on the run with ``mlflow.log_input``, or a
window of the version's served traffic); else the version's first served window. The choice is
described in words for the report.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow import MlflowClient

from flows import feature_parity
from monitoring.inference_frames import served_feature_rows
from monitoring.reference import ServedReference, first_served_window, pinned_window
from serving.endpoints.monitoring_settings import MonitoringConfig
from serving.inference_log import read_inference_log
from serving.registry import versions
from serving.settings import Settings

PREDICTION = "prediction"
MAX_REFERENCE_PREDICTIONS = 5000


def prediction_score(value: Any) -> float | None:
    """One number per served row: a binary classifier's positive-class probability, a multi-class
    classifier's argmax, a regressor's value."""
    if isinstance(value, dict):
        value = next(iter(value.values()), None)
    if isinstance(value, (list, tuple, np.ndarray)):
        values = [float(v) for v in value]
        if not values:
            return None
        if len(values) == 1:
            return values[0]
        return values[1] if len(values) == 2 else float(int(np.argmax(values)))
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def served_rows(log: pd.DataFrame) -> pd.DataFrame:
    """One row per served row of successful requests: the features the model was fed (or, without a
    FeatureService, the request's columns), its prediction, request id, time, entity and version."""
    ok = log[log["status_code"] == 200] if not log.empty else log
    if ok.empty:
        return pd.DataFrame()
    with_features = served_feature_rows(ok[ok["served_features"].notna()])
    frames = [with_features] if not with_features.empty else []
    plain = ok[ok["served_features"].isna() & ok["inputs"].notna()]
    for request_id, ts, inputs in zip(plain["request_id"], plain["timestamp"], plain["inputs"]):
        frame = feature_parity.request_frame(inputs)
        if frame is not None:
            frames.append(
                frame.reset_index(drop=True).assign(request_id=request_id, timestamp=ts, row=range(len(frame)))
            )
    if not frames:
        return pd.DataFrame()
    rows = pd.concat(frames, ignore_index=True)
    scores = []
    for request_id, out in zip(ok["request_id"], ok["outputs"]):
        values = json.loads(out) if out else []
        for index, value in enumerate(values if isinstance(values, list) else [values]):
            scores.append({"request_id": request_id, "row": index, PREDICTION: prediction_score(value)})
    if scores:
        rows = rows.merge(pd.DataFrame(scores), on=["request_id", "row"], how="left")
    return rows.merge(ok[["request_id", "served_entity", "model_version"]], on="request_id", how="left")


def reference_predictions(model_uri: str, reference: pd.DataFrame) -> pd.Series | None:
    """The version's own predictions on (a sample of) its training rows; None if it cannot score them."""
    import mlflow.pyfunc

    model = mlflow.pyfunc.load_model(model_uri)
    schema = model.metadata.get_input_schema()
    names = schema.input_names() if schema is not None and schema.has_input_names() else None
    if not names or any(n not in reference.columns for n in names):
        return None
    sample = reference.sample(min(len(reference), MAX_REFERENCE_PREDICTIONS), random_state=0)
    predictions = np.asarray(model.predict(sample[names]))
    return pd.Series([prediction_score(v) for v in predictions.tolist()], index=sample.index, dtype=float)


@dataclass(frozen=True)
class Reference:
    frame: pd.DataFrame | None  # None: nothing to compare with yet (``described`` says why)
    described: str
    served: ServedReference | None = None  # set when the reference is the version's own served traffic
    scored: bool = False  # its PREDICTION column is the version's own (served) predictions


def _logged_dataset(client: MlflowClient, run_id: str, name: str) -> pd.DataFrame:
    """The dataset called ``name`` logged on the run with ``mlflow.log_input``, loaded from its source."""
    import mlflow.data

    inputs = client.get_run(run_id).inputs.dataset_inputs
    found = [d for d in inputs if d.dataset.name == name]
    if not found:
        raise LookupError(
            f"run {run_id} logged no dataset named {name!r} (it logged {sorted(d.dataset.name for d in inputs)})"
        )
    path = Path(mlflow.data.get_source(found[-1]).load())
    return pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)


def reference_for(
    settings: Settings,
    client: MlflowClient,
    endpoint: str,
    entity: str,
    model_name: str,
    version: str,
    config: MonitoringConfig,
    now: datetime,
) -> Reference:
    """The version's drift reference (see the module's docstring for the order)."""
    run_id = client.get_model_version(model_name, version).run_id
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = versions.training_reference(settings.tracking_uri, model_name, version, Path(tmp))
            return Reference(pd.read_parquet(path), f"training frame logged on run {run_id}")
        except Exception:
            pass
    pinned = config.reference
    if pinned.dataset is not None:
        return Reference(
            _logged_dataset(client, run_id, pinned.dataset), f"dataset {pinned.dataset!r} logged on run {run_id}"
        )
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=pinned.start)
    rows = served_rows(log)
    if not rows.empty:
        rows = rows[(rows["served_entity"] == entity) & (rows["model_version"].astype(str) == str(version))]
    if pinned.start is not None and pinned.end is not None:
        served = pinned_window(rows, pinned.start, pinned.end)
    else:
        served = first_served_window(rows, pinned.first_requests, pinned.first_hours, now)
    if not served.complete or served.rows.empty:
        return Reference(None, served.described, served)
    return Reference(served.rows, served.described, served, scored=True)
