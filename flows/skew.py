"""Skew and drift flow: ``python -m flows.skew --endpoint NAME``.

For each served version of the endpoint, over the recent inference log:
- distribution drift of the served features against that version's training data (Evidently);
- parity skew: a sample of logged rows recomputed offline at their logged time through the same
  FeatureService, a mismatch rate per feature (where the model has a FeatureService).
Each run leaves table artifacts, the HTML report as a link artifact, and a Prefect event per finding;
drift or skew ends the run Failed (unless ``fail_on_finding=False``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.events import emit_event

from feature_repo import store as feature_store
from flows import feature_parity, registry
from monitoring.drift import DriftConfig, DriftResult, compute_drift
from monitoring.inference_frames import served_feature_rows
from monitoring.parity import ParityResult
from serving.endpoint_store import EndpointStore
from serving.inference_log import read_inference_log
from serving.settings import Settings

NOT_FEATURES = ("request_id", "timestamp", "row", "event_timestamp", "transaction_id", "served_entity", "model_version")


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@task
def drift_for_version(settings: Settings, model_name: str, version: str, current: pd.DataFrame, config: DriftConfig) -> DriftResult:
    with tempfile.TemporaryDirectory() as tmp:
        reference = pd.read_parquet(registry.training_reference(settings.tracking_uri, model_name, version, Path(tmp)))
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


@flow(name="skew-drift")
def skew(endpoint: str, window_hours: float = 24.0, fail_on_finding: bool = True, min_rows: int = 50,
         parity_sample: int = 200) -> dict[str, Any]:
    """Drift and parity skew of the endpoint's served features, per served version."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    now = datetime.now(timezone.utc)
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=now - timedelta(hours=window_hours))
    current = served_feature_rows(log)
    if len(current) < min_rows:
        logger.warning("only %d served rows for %s in the last %.0f h (need %d): not enough data yet",
                       len(current), endpoint, window_hours, min_rows)
        return {"endpoint": endpoint, "verdict": "not enough data", "rows": len(current)}
    current = current.merge(log[["request_id", "served_entity", "model_version"]], on="request_id", how="left")
    record = EndpointStore(settings.endpoints_db).get(endpoint)
    models = {e.name: e.entity_name for e in record.config.served_entities}
    client = MlflowClient(settings.tracking_uri)
    summary: dict[str, Any] = {"endpoint": endpoint, "versions": {}}
    findings: list[str] = []
    stamp = now.strftime("%Y%m%dT%H%M%SZ")
    for (entity, version), rows in current.groupby(["served_entity", "model_version"]):
        model_name = models.get(entity, str(entity).rsplit("-", 1)[0])
        label = f"{model_name}/{version}"
        drift = drift_for_version(settings, model_name, str(version), rows, DriftConfig())
        report = save_report(drift, settings.reports_dir / endpoint, f"drift-{model_name}-v{version}-{stamp}.html")
        key = artifact_key(f"drift-{endpoint}-{model_name}-v{version}")
        create_table_artifact(key=key, table=drift.table(),
                              description=f"Drift of served features, {endpoint} {label}: share {drift.drift_share:.2f}")
        create_link_artifact(key=f"{key}-report", link=report.as_uri(), description="Evidently drift report (HTML)")
        entry: dict[str, Any] = {"rows": drift.current_rows, "drift_share": drift.drift_share,
                                 "drifted": drift.drifted_columns(), "report": str(report)}
        if drift.drifted_columns():
            findings += [f"drift {label}:{c}" for c in drift.drifted_columns()]
            _event("tollfree.drift.detected", endpoint, {"model": model_name, "version": str(version), "columns": drift.drifted_columns()})

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
                    _event("tollfree.skew.detected", endpoint, {"model": model_name, "version": str(version), "features": parity.mismatched()})
        summary["versions"][label] = entry
        logger.info("%s: %d served rows, drift share %.2f, drifted %s, parity mismatches %s; report %s", label,
                    drift.current_rows, drift.drift_share, drift.drifted_columns() or "none",
                    entry.get("parity_mismatched", "n/a") or "none", report)
    summary["verdict"] = "findings" if findings else "clean"
    summary["findings"] = findings
    if findings and fail_on_finding:
        raise RuntimeError(f"endpoint {endpoint}: {'; '.join(findings)}")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=skew.__doc__)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--window-hours", type=float, default=24.0)
    args = parser.parse_args(argv)
    skew(endpoint=args.endpoint, window_hours=args.window_hours)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
