"""Skew and drift flow: ``python -m flows.skew --endpoint NAME``.

For each served version of the endpoint, over the recent inference log:
- distribution drift of the served inputs and of the predictions against that version's training
  data (Evidently, explicit methods, thresholds from ``DriftConfig``): the features a FeatureService
  served, or the request's own columns for a model without one; predictions against the version's own
  predictions on its training rows;
- parity skew: a sample of logged rows recomputed offline at their logged time through the same
  FeatureService, a mismatch rate per feature (where the model has a FeatureService).
Every run leaves a summary table artifact with the verdict, a table per version, the HTML report
linked by a link artifact, and Prefect events: ``tollfree.drift.detected`` / ``tollfree.skew.detected``
per finding, and ``tollfree.skew-drift.<verdict>`` once per run. A finding ends the run Failed
(unless ``fail_on_finding=False``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import fields, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.events import emit_event

from feature_repo import store as feature_store
from flows import feature_parity
from monitoring.drift import DriftConfig, DriftResult, compute_drift
from monitoring.inference_frames import served_feature_rows
from monitoring.parity import ParityResult
from serving.endpoints.store import EndpointStore
from serving.inference_log import read_inference_log
from serving.registry import versions
from serving.settings import Settings

NOT_FEATURES = ("request_id", "timestamp", "row", "event_timestamp", "transaction_id", "served_entity", "model_version")
PREDICTION = "prediction"
MAX_REFERENCE_PREDICTIONS = 5000


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def drift_config(values: dict[str, Any] | None) -> DriftConfig:
    """``DriftConfig`` with ``values`` overriding its defaults; an unknown key is refused by name."""
    values = dict(values or {})
    unknown = sorted(set(values) - {f.name for f in fields(DriftConfig)})
    if unknown:
        raise ValueError(f"unknown drift setting(s): {', '.join(unknown)}")
    return replace(DriftConfig(), **values)


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
            frames.append(frame.reset_index(drop=True).assign(request_id=request_id, timestamp=ts, row=range(len(frame))))
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


@task
def drift_for_version(settings: Settings, model_name: str, version: str, current: pd.DataFrame, config: DriftConfig,
                      with_predictions: bool = True) -> DriftResult | None:
    with tempfile.TemporaryDirectory() as tmp:
        try:
            reference = pd.read_parquet(versions.training_reference(settings.tracking_uri, model_name, version, Path(tmp)))
        except Exception as exc:  # any model may lack the training frame: say so, do not guess
            get_run_logger().warning("%s v%s: no training reference on its run (%s); drift not computed",
                                     model_name, version, type(exc).__name__)
            return None
    if with_predictions and PREDICTION in current.columns and current[PREDICTION].notna().any():
        scored = reference_predictions(f"models:/{model_name}/{version}", reference)
        if scored is not None:
            reference = reference.loc[scored.index].assign(**{PREDICTION: scored})
    columns = [c for c in current.columns if c in reference.columns and c not in NOT_FEATURES]
    return compute_drift(reference, current, columns, config)


@task
def parity_for_version(settings: Settings, service_name: str, log: pd.DataFrame, sample: int) -> ParityResult | None:
    rows = feature_parity.logged_rows(log, sample=sample, seed=0)
    if rows.empty:
        return None
    return feature_parity.parity_of(feature_store.open_store(settings.home), service_name, rows)


def save_report(result: DriftResult, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    tmp = folder / f".{name}.tmp"
    result.snapshot.save_html(str(tmp))
    os.replace(tmp, target)
    return target


def _event(name: str, endpoint: str, payload: dict[str, Any]) -> None:
    emit_event(event=name, resource={"prefect.resource.id": f"tollfree.endpoint.{endpoint}"}, payload=payload)


def _summary_artifact(endpoint: str, summary: dict[str, Any]) -> None:
    rows = [{"version": label, "rows": v.get("rows"), "drift_share": v.get("drift_share"),
             "drifted": ", ".join(v.get("drifted") or []) or None, "parity_rows": v.get("parity_rows"),
             "parity_mismatched": ", ".join(v.get("parity_mismatched") or []) or None, "report": v.get("report")}
            for label, v in summary.get("versions", {}).items()]
    rows.append({"version": "verdict", "rows": summary.get("rows"), "drift_share": None,
                 "drifted": summary["verdict"], "parity_rows": None,
                 "parity_mismatched": "; ".join(summary.get("findings", [])) or None, "report": None})
    create_table_artifact(key=artifact_key(f"skew-drift-{endpoint}"), table=rows,
                          description=f"Skew and drift of {endpoint}: {summary['verdict']}")


@flow(name="skew-drift")
def skew(endpoint: str, window_hours: float = 24.0, fail_on_finding: bool = True, min_rows: int = 50,
         parity_sample: int = 200, drift: dict[str, Any] | None = None, prediction_drift: bool = True) -> dict[str, Any]:
    """Drift and parity skew of the endpoint's served inputs and predictions, per served version."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    config = drift_config(drift)
    now = datetime.now(timezone.utc)
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=now - timedelta(hours=window_hours))
    current = served_rows(log)
    if len(current) < min_rows:
        logger.warning("only %d served rows for %s in the last %.0f h (need %d): not enough data yet",
                       len(current), endpoint, window_hours, min_rows)
        summary = {"endpoint": endpoint, "verdict": "not enough data", "rows": len(current), "versions": {}, "findings": []}
        _summary_artifact(endpoint, summary)
        _event("tollfree.skew-drift.not-enough-data", endpoint, {"rows": len(current), "min_rows": min_rows})
        return summary
    record = EndpointStore(settings.endpoints_db).get(endpoint)
    models = {e.name: e.entity_name for e in record.config.served_entities}
    client = MlflowClient(settings.tracking_uri)
    summary: dict[str, Any] = {"endpoint": endpoint, "versions": {}, "rows": len(current)}
    findings: list[str] = []
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    for (entity, version), rows in current.groupby(["served_entity", "model_version"]):
        model_name = models.get(entity, str(entity).rsplit("-", 1)[0])
        label = f"{model_name}/{version}"
        entry: dict[str, Any] = {"rows": len(rows)}
        if len(rows) < min_rows:
            entry["verdict"] = "not enough data"
            summary["versions"][label] = entry
            continue
        result = drift_for_version(settings, model_name, str(version), rows, config, prediction_drift)
        if result is not None:
            report = save_report(result, settings.reports_dir / endpoint, f"drift-{model_name}-v{version}-{stamp}.html")
            key = artifact_key(f"drift-{endpoint}-{model_name}-v{version}")
            create_table_artifact(key=key, table=result.table(),
                                  description=f"Drift of served inputs and predictions, {endpoint} {label}: share {result.drift_share:.2f}")
            create_link_artifact(key=f"{key}-report", link=report.as_uri(), description="Evidently drift report (HTML)")
            entry.update({"drift_share": result.drift_share, "drifted": result.drifted_columns(), "report": str(report)})
            if result.drifted_columns():
                findings += [f"drift {label}:{c}" for c in result.drifted_columns()]
                _event("tollfree.drift.detected", endpoint, {"model": model_name, "version": str(version),
                                                             "columns": result.drifted_columns(),
                                                             "drift_share": result.drift_share})

        service = client.get_model_version(model_name, str(version)).tags.get("feature_service")
        if service:
            version_log = log[(log["served_entity"] == entity) & (log["model_version"] == version)]
            parity = parity_for_version(settings, service, version_log, parity_sample)
            if parity is not None:
                create_table_artifact(key=artifact_key(f"parity-{endpoint}-{model_name}-v{version}"), table=parity.table(),
                                      description=f"Served vs offline features at the logged time, {label}, {parity.rows} rows")
                entry["parity_rows"], entry["parity_mismatched"] = parity.rows, parity.mismatched()
                if parity.mismatched():
                    findings += [f"skew {label}:{f}" for f in parity.mismatched()]
                    _event("tollfree.skew.detected", endpoint, {"model": model_name, "version": str(version),
                                                                "features": parity.mismatched()})
        summary["versions"][label] = entry
        logger.info("%s: %d served rows, drift share %s, drifted %s, parity mismatches %s; report %s", label,
                    len(rows), entry.get("drift_share", "n/a"), entry.get("drifted") or "none",
                    entry.get("parity_mismatched", "n/a") or "none", entry.get("report", "none"))
    summary["verdict"] = "findings" if findings else "clean"
    summary["findings"] = findings
    _summary_artifact(endpoint, summary)
    _event(f"tollfree.skew-drift.{summary['verdict']}", endpoint, {"findings": findings[:50]})
    if findings and fail_on_finding:
        raise RuntimeError(f"endpoint {endpoint}: {'; '.join(findings)}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=skew.__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--window-hours", type=float, default=24.0)
    parser.add_argument("--drift", type=json.loads, default=None, help='JSON, e.g. {"numeric_threshold": 0.25}')
    args = parser.parse_args(argv)
    skew(endpoint=args.endpoint, window_hours=args.window_hours, drift=args.drift)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
