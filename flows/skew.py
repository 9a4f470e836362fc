"""Skew and drift flow: served features (from the inference log) against the training data of the
served version. ``python -m flows.skew --endpoint NAME``."""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.events import emit_event

from flows import registry
from monitoring.drift import DriftConfig, DriftResult, compute_drift
from monitoring.inference_frames import served_feature_rows
from serving.endpoint_store import EndpointStore
from serving.inference_log import read_inference_log
from serving.settings import Settings


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


@task
def served_rows(settings: Settings, endpoint: str, since: datetime) -> pd.DataFrame:
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=since)
    frame = served_feature_rows(log)
    if not frame.empty:
        frame = frame.merge(log[["request_id", "served_entity", "model_version"]], on="request_id", how="left")
    return frame


@task
def drift_for_version(settings: Settings, model_name: str, version: str, current: pd.DataFrame, config: DriftConfig) -> DriftResult:
    with tempfile.TemporaryDirectory() as tmp:
        reference = pd.read_parquet(registry.training_reference(settings.tracking_uri, model_name, version, Path(tmp)))
    columns = [c for c in current.columns if c in reference.columns and c not in ("request_id", "timestamp", "row", "event_timestamp", "transaction_id")]
    return compute_drift(reference, current, columns, config)


def save_report(result: DriftResult, folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    tmp = folder / f".{name}.tmp"
    result.snapshot.save_html(str(tmp))
    os.replace(tmp, target)
    return target


@flow(name="skew-drift")
def skew(endpoint: str, window_hours: float = 24.0, fail_on_drift: bool = True, min_rows: int = 50) -> dict[str, Any]:
    """Drift of the endpoint's served features against each served version's training data."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    now = datetime.now(timezone.utc)
    current = served_rows(settings, endpoint, now - timedelta(hours=window_hours))
    if len(current) < min_rows:
        logger.warning("only %d served rows for %s in the last %.0f h (need %d): not enough data yet",
                       len(current), endpoint, window_hours, min_rows)
        return {"endpoint": endpoint, "verdict": "not enough data", "rows": len(current)}
    record = EndpointStore(settings.endpoints_db).get(endpoint)
    models = {e.name: e.entity_name for e in record.config.served_entities}
    summary: dict[str, Any] = {"endpoint": endpoint, "versions": {}}
    drifted: list[str] = []
    for (entity, version), rows in current.groupby(["served_entity", "model_version"]):
        model_name = models.get(entity, str(entity).rsplit("-", 1)[0])
        result = drift_for_version(settings, model_name, str(version), rows.drop(columns=["served_entity", "model_version"]), DriftConfig())
        stamp = now.strftime("%Y%m%dT%H%M%SZ")
        report = save_report(result, settings.reports_dir / endpoint, f"drift-{model_name}-v{version}-{stamp}.html")
        key = artifact_key(f"drift-{endpoint}-{model_name}-v{version}")
        create_table_artifact(key=key, table=result.table(), description=f"Drift of served features, {endpoint} {model_name} v{version}: share {result.drift_share:.2f}")
        create_link_artifact(key=f"{key}-report", link=report.as_uri(), description="Evidently drift report (HTML)")
        summary["versions"][f"{model_name}/{version}"] = {
            "rows": result.current_rows, "drift_share": result.drift_share, "drifted": result.drifted_columns(), "report": str(report),
        }
        if result.dataset_drift or result.drifted_columns():
            drifted += [f"{model_name}/{version}:{c}" for c in result.drifted_columns()]
            emit_event(event="tollfree.drift.detected", resource={"prefect.resource.id": f"tollfree.endpoint.{endpoint}"},
                       payload={"model": model_name, "version": str(version), "columns": result.drifted_columns()})
        logger.info("%s v%s: %d served rows, drift share %.2f, drifted: %s; report %s", model_name, version,
                    result.current_rows, result.drift_share, result.drifted_columns() or "none", report)
    summary["verdict"] = "drift" if drifted else "no drift"
    if drifted and fail_on_drift:
        raise RuntimeError(f"drift detected on endpoint {endpoint}: {', '.join(drifted)}")
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
