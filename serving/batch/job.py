"""Batch scoring: features point-in-time through the model's FeatureService, predictions in chunks,
output published atomically (a reader sees all of a run's output or none of it)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from feature_repo import store as feature_store
from serving.runtime import FEATURE_SERVICE_KEY

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchResult:
    rows: int
    output: Path
    model_uri: str
    model_version: str
    seconds: float


def resolve_version(model_uri: str, tracking_uri: str) -> str:
    """The registry version behind ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if not model_uri.startswith("models:/"):
        raise ValueError(f"model URI must be a registry URI models:/NAME@ALIAS or models:/NAME/VERSION, got {model_uri[:100]!r}")
    rest = model_uri[len("models:/"):]
    client = MlflowClient(tracking_uri)
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            return str(client.get_model_version_by_alias(name, alias).version)
        name, version = rest.rsplit("/", 1)
        return str(client.get_model_version(name, version).version)
    except MlflowException as exc:
        raise LookupError(f"no model version found for {model_uri}") from exc


def _required_columns(store, service_name: str, key_column: str) -> list[str]:
    service = feature_store.feature_service(store, service_name)
    keys = feature_store.entity_join_keys(store, service)
    fields = list(feature_store.request_fields(store, service))
    return [key_column, *keys, *fields, "event_timestamp"]


def score_dataset(
    input_path: Path,
    output_root: Path,
    model_uri: str,
    home: Path,
    tracking_uri: str,
    run_id: str,
    key_column: str = "transaction_id",
    chunk_rows: int = 100_000,
) -> BatchResult:
    """Score every row of ``input_path``; write ``output_root/model_version=V/run_id=ID/part-N.parquet``."""
    import mlflow.pyfunc

    started = time.perf_counter()
    if not Path(input_path).exists():
        raise FileNotFoundError(f"batch input not found: {input_path}")
    version = resolve_version(model_uri, tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    service_name = (model.metadata.metadata or {}).get(FEATURE_SERVICE_KEY)
    if not service_name:
        raise ValueError(f"{model_uri} has no feature service in its metadata; batch scoring needs one")
    store = feature_store.open_store(home)
    names = feature_store.feature_names(feature_store.feature_service(store, service_name))
    dataset = ds.dataset(str(input_path), format="parquet")
    required = _required_columns(store, service_name, key_column)
    missing = [c for c in required if c not in dataset.schema.names]
    if missing:
        raise ValueError(f"batch input {input_path} is missing column(s): {', '.join(missing)}")
    if dataset.count_rows() == 0:
        raise ValueError(f"batch input {input_path} is empty")

    final = Path(output_root) / f"model_version={version}" / f"run_id={run_id}"
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".run_id={run_id}.", suffix=".tmp"))
    rows = 0
    try:
        for part, batch in enumerate(dataset.to_batches(columns=required, batch_size=chunk_rows)):
            entities = batch.to_pandas()
            entities["event_timestamp"] = pd.to_datetime(entities["event_timestamp"], utc=True).dt.floor("us")
            features = store.get_historical_features(entity_df=entities, features=store.get_feature_service(service_name)).to_df()
            if len(features) != len(entities):
                raise RuntimeError(f"feature retrieval dropped rows: {len(features)} of {len(entities)}")
            scores = model.predict(features[names])
            scores = scores[:, 1] if getattr(scores, "ndim", 1) == 2 else scores
            out = pd.DataFrame(
                {
                    key_column: features[key_column].to_numpy(),
                    "event_timestamp": features["event_timestamp"].to_numpy(),
                    "prediction": scores,
                    "model_version": version,
                    "run_id": run_id,
                }
            )
            pq.write_table(pa.Table.from_pandas(out, preserve_index=False), staging / f"part-{part:05d}.parquet")
            rows += len(out)
            log.info("batch %s: %d rows scored (%.0f rows/s)", run_id, rows, rows / (time.perf_counter() - started))
        if final.exists():
            shutil.rmtree(final)  # the same run id replaces its own output, nothing else
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BatchResult(rows, final, model_uri, version, time.perf_counter() - started)
