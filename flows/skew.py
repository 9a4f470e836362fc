"""Skew and drift flows: ``python -m flows.skew [--endpoint NAME ...]``.

``skew`` checks one endpoint. For each served version, over the recent inference log:
- distribution drift of the served inputs and of the predictions against that version's reference
  (``flows.served_data.reference_for``: its training frame, else a reference the endpoint's
  ``monitoring.reference`` pins, else its first served window; the report says which), with Evidently,
  explicit methods and thresholds from ``DriftConfig``: the features a FeatureService served, or the
  request's own columns for a model without one; predictions against the version's own predictions.
  Drift is a finding when the version's columns drift as the settings define it (``DriftResult.dataset_drift``:
  at least one column, after the correction for testing them all, and at least ``drift_share`` of them);
- parity skew: a sample of logged rows recomputed offline at their logged time through the same
  FeatureService, a mismatch rate per feature (where the model has a FeatureService).
Every run leaves a summary table artifact with the verdict, a table per version, the HTML report
linked by a link artifact, and Prefect events: ``tollfree.drift.detected`` (naming every drifted
column) / ``tollfree.skew.detected`` per finding, and ``tollfree.skew-drift.<verdict>`` once per run; a run that
compared data also records its verdict in the state folder for the gateway (``serving.endpoints.monitoring_results``:
the console's flag, the ``tollfree_drift_findings`` metric).
A finding ends the run Failed (unless ``fail_on_finding=False``). The endpoint's config
(``monitoring``) may opt it out or set its own thresholds, window and minimum rows; a flow parameter,
when given, wins over it.

An edge device group is the endpoint ``edge:GROUP`` (``flows.monitored``): its devices' records, default settings.

``skew_all`` (the hourly deployment) runs ``skew`` as a subflow for every endpoint and edge device group, one after
another: one's failure does not stop the others, its own artifact says what it found; the parent's lists every verdict.
"""

from __future__ import annotations

import argparse
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_link_artifact, create_table_artifact
from prefect.events import emit_event

from feature_repo import store as feature_store
from flows import feature_parity
from flows.fan_out import artifact_key, for_each_endpoint, raise_for
from flows.monitored import monitored, monitoring_of
from flows.served_data import PREDICTION, Reference, reference_for, reference_predictions, served_rows
from monitoring.drift import DriftResult, compute_drift
from monitoring.parity import ParityResult
from monitoring.reference import after
from serving.endpoints import monitoring_results
from serving.endpoints.monitoring_settings import DriftConfig, MonitoringConfig, overridden
from serving.inference_log import read_inference_log
from serving.settings import Settings

NOT_FEATURES = ("request_id", "timestamp", "row", "event_timestamp", "transaction_id", "served_entity", "model_version")


def drift_config(values: dict[str, Any] | None) -> DriftConfig:
    """``DriftConfig`` with ``values`` overriding its defaults; an unknown key or a mistyped value is refused by
    name."""
    return overridden(DriftConfig, values, "drift setting")


@task
def drift_for_version(
    model_name: str,
    version: str,
    reference: Reference,
    current: pd.DataFrame,
    config: DriftConfig,
    with_predictions: bool = True,
) -> DriftResult:
    frame = reference.frame
    assert frame is not None
    if (
        with_predictions
        and not reference.scored
        and PREDICTION in current.columns
        and current[PREDICTION].notna().any()
    ):
        scored = reference_predictions(f"models:/{model_name}/{version}", frame)
        if scored is not None:
            frame = frame.loc[scored.index].assign(**{PREDICTION: scored})
    if not with_predictions:
        current = current.drop(columns=[PREDICTION], errors="ignore")
    columns = [c for c in current.columns if c in frame.columns and c not in NOT_FEATURES]
    return compute_drift(frame, current, columns, config, report=True)


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


def _nothing_compared(endpoint: str, verdict: str, rows: int) -> dict[str, Any]:
    """The summary (and its artifact) of a run that compared no version."""
    summary = {"endpoint": endpoint, "verdict": verdict, "rows": rows, "versions": {}, "findings": []}
    _summary_artifact(endpoint, summary)
    return summary


def _summary_artifact(endpoint: str, summary: dict[str, Any]) -> None:
    rows = [
        {
            "version": label,
            "rows": v.get("rows"),
            "reference": v.get("reference"),
            "verdict": v.get("verdict"),
            "drift_share": v.get("drift_share"),
            "drift": v.get("dataset_drift"),
            "drifted": ", ".join(v.get("drifted") or []) or None,
            "parity_rows": v.get("parity_rows"),
            "parity_mismatched": ", ".join(v.get("parity_mismatched") or []) or None,
            "report": v.get("report"),
        }
        for label, v in summary.get("versions", {}).items()
    ]
    rows.append(
        {
            "version": "verdict",
            "rows": summary.get("rows"),
            "reference": None,
            "verdict": summary["verdict"],
            "drift_share": None,
            "drift": None,
            "drifted": summary["verdict"],
            "parity_rows": None,
            "parity_mismatched": "; ".join(summary.get("findings", [])) or None,
            "report": None,
        }
    )
    create_table_artifact(
        key=artifact_key(f"skew-drift-{endpoint}"),
        table=rows,
        description=f"Skew and drift of {endpoint}: {summary['verdict']}",
    )


@flow(name="skew-drift")
def skew(
    endpoint: str,
    window_hours: float | None = None,
    fail_on_finding: bool = True,
    min_rows: int | None = None,
    parity_sample: int = 200,
    drift: dict[str, Any] | None = None,
    prediction_drift: bool = True,
) -> dict[str, Any]:
    """Drift and parity skew of the endpoint's served inputs and predictions, per served version."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    monitoring, models = monitoring_of(settings, endpoint)
    if not monitoring.enabled:
        logger.info("%s: monitoring is off in the endpoint's config; nothing checked", endpoint)
        return _nothing_compared(endpoint, "disabled", 0)
    window_hours = window_hours if window_hours is not None else monitoring.window_hours
    min_rows = min_rows if min_rows is not None else monitoring.min_rows
    config = drift_config(drift if drift is not None else monitoring.drift)
    now = datetime.now(UTC)
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=now - timedelta(hours=window_hours))
    current = served_rows(log)
    if len(current) < min_rows:
        logger.warning(
            "only %d served rows for %s in the last %.0f h (need %d): not enough data yet",
            len(current),
            endpoint,
            window_hours,
            min_rows,
        )
        _event("tollfree.skew-drift.not-enough-data", endpoint, {"rows": len(current), "min_rows": min_rows})
        return _nothing_compared(endpoint, "not enough data", len(current))
    if models is None:  # a device group's records name the model itself as the served entity
        models = {str(e): str(e) for e in current["served_entity"].unique()}
    check = VersionCheck(
        settings,
        MlflowClient(settings.tracking_uri),
        endpoint,
        monitoring,
        config,
        min_rows,
        parity_sample,
        prediction_drift,
        now,
    )
    summary: dict[str, Any] = {"endpoint": endpoint, "versions": {}, "rows": len(current)}
    findings: list[str] = []
    for (entity, version), rows in current.groupby(["served_entity", "model_version"]):
        model_name = models.get(entity, str(entity).rsplit("-", 1)[0])
        label = f"{model_name}/{version}"
        version_log = log[(log["served_entity"] == entity) & (log["model_version"] == version)]
        entry = check.run(str(entity), model_name, str(version), rows, version_log, findings)
        summary["versions"][label] = entry
        logger.info(
            "%s: %d served rows compared with %s: drift share %s, drifted %s, parity mismatches %s; report %s",
            label,
            entry["rows"],
            entry.get("reference", "n/a"),
            entry.get("drift_share", "n/a"),
            entry.get("drifted") or "none",
            entry.get("parity_mismatched", "n/a") or "none",
            entry.get("report", "none"),
        )
    summary["verdict"] = "findings" if findings else "clean"
    summary["findings"] = findings
    _summary_artifact(endpoint, summary)
    monitoring_results.save_latest(settings.home, summary, now)  # for the gateway: its console and metrics
    _event(f"tollfree.skew-drift.{summary['verdict']}", endpoint, {"findings": findings[:50]})
    if findings and fail_on_finding:
        raise RuntimeError(f"endpoint {endpoint}: {'; '.join(findings)}")
    return summary


class VersionCheck:
    """One served version's drift (against its reference) and parity skew, its artifacts and events."""

    def __init__(
        self,
        settings: Settings,
        client: MlflowClient,
        endpoint: str,
        monitoring: MonitoringConfig,
        config: DriftConfig,
        min_rows: int,
        parity_sample: int,
        prediction_drift: bool,
        now: datetime,
    ) -> None:
        self.settings, self.client, self.endpoint, self.monitoring = settings, client, endpoint, monitoring
        self.config, self.min_rows, self.parity_sample, self.prediction_drift = (
            config,
            min_rows,
            parity_sample,
            prediction_drift,
        )
        self.now = now

    def run(
        self,
        entity: str,
        model_name: str,
        version: str,
        rows: pd.DataFrame,
        version_log: pd.DataFrame,
        findings: list[str],
    ) -> dict[str, Any]:
        entry: dict[str, Any] = {"rows": len(rows)}
        if len(rows) < self.min_rows:
            entry["verdict"] = "not enough data"
            return entry
        reference = reference_for(
            self.settings, self.client, self.endpoint, entity, model_name, version, self.monitoring, self.now
        )
        entry["reference"] = reference.described
        compared = after(rows, reference.served) if reference.served is not None else rows
        if reference.frame is None:
            entry["verdict"] = "no reference yet"
        elif len(compared) < self.min_rows:
            entry["verdict"] = f"not enough data after the reference ({len(compared)} rows)"
        else:
            self._drift(model_name, version, reference, compared, entry, findings)
        service = self.client.get_model_version(model_name, version).tags.get("feature_service")
        if service:
            self._parity(model_name, version, service, version_log, entry, findings)
        return entry

    def _drift(
        self,
        model_name: str,
        version: str,
        reference: Reference,
        compared: pd.DataFrame,
        entry: dict[str, Any],
        findings: list[str],
    ) -> None:
        label = f"{model_name}/{version}"
        result = drift_for_version(model_name, version, reference, compared, self.config, self.prediction_drift)
        stamp = self.now.strftime("%Y%m%dT%H%M%SZ")
        report = save_report(
            result, self.settings.reports_dir / self.endpoint, f"drift-{model_name}-v{version}-{stamp}.html"
        )
        key = artifact_key(f"drift-{self.endpoint}-{model_name}-v{version}")
        create_table_artifact(
            key=key,
            table=result.table(),
            description=f"Drift of served inputs and predictions, {self.endpoint} {label}, against the "
            f"{reference.described}: {'drift' if result.dataset_drift else 'no drift'}, share "
            f"{result.drift_share:.2f}, drifted "
            f"{', '.join(result.drifted_columns()) or 'none'}",
        )
        create_link_artifact(key=f"{key}-report", link=report.as_uri(), description="Evidently drift report (HTML)")
        entry.update(
            {
                "compared_rows": len(compared),
                "drift_share": result.drift_share,
                "drifted": result.drifted_columns(),
                "dataset_drift": result.dataset_drift,
                "report": str(report),
            }
        )
        if result.drifted_columns() and not result.dataset_drift:
            get_run_logger().info(
                "%s: %s drifted, fewer than drift_share %.2f of the columns: not a finding",
                label,
                ", ".join(result.drifted_columns()),
                self.config.drift_share,
            )
        if result.dataset_drift:
            findings += result.findings(label)
            _event(
                "tollfree.drift.detected",
                self.endpoint,
                {
                    "model": model_name,
                    "version": version,
                    "columns": result.drifted_columns(),
                    "drift_share": result.drift_share,
                    "reference": entry["reference"],
                },
            )

    def _parity(
        self,
        model_name: str,
        version: str,
        service: str,
        version_log: pd.DataFrame,
        entry: dict[str, Any],
        findings: list[str],
    ) -> None:
        label = f"{model_name}/{version}"
        parity = parity_for_version(self.settings, service, version_log, self.parity_sample)
        if parity is None:
            return
        create_table_artifact(
            key=artifact_key(f"parity-{self.endpoint}-{model_name}-v{version}"),
            table=parity.table(),
            description=f"Served vs offline features at the logged time, {label}, {parity.rows} rows",
        )
        entry["parity_rows"], entry["parity_mismatched"] = parity.rows, parity.mismatched()
        if parity.mismatched():
            findings += [f"skew {label}:{f}" for f in parity.mismatched()]
            _event(
                "tollfree.skew.detected",
                self.endpoint,
                {"model": model_name, "version": version, "features": parity.mismatched()},
            )


@flow(name="skew-drift-all")
def skew_all(
    endpoints: list[str] | None = None,
    window_hours: float | None = None,
    fail_on_finding: bool = True,
    min_rows: int | None = None,
    drift: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``skew`` for every endpoint (or the ones named), each as its own subflow; one's failure stops no other."""
    settings = Settings.from_environ(os.environ)
    names = endpoints or monitored(settings)
    results = for_each_endpoint(
        "skew-drift", skew, names, fail_on_finding=False, window_hours=window_hours, min_rows=min_rows, drift=drift
    )
    raise_for("skew-drift", results, lambda r: fail_on_finding and r.get("verdict") == "findings")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=skew_all.__doc__)
    parser.add_argument("--endpoint", action="append", help="an endpoint to check (repeat it); default: every endpoint")
    parser.add_argument(
        "--window-hours", type=float, default=None, help="default: the endpoint's monitoring.window_hours"
    )
    parser.add_argument(
        "--drift", type=json.loads, default=None, help='JSON, e.g. {"numeric_threshold": 0.001, "drift_share": 0.1}'
    )
    args = parser.parse_args(argv)
    result = skew_all(endpoints=args.endpoint, window_hours=args.window_hours, drift=args.drift, return_state=True)
    return 0 if result.is_completed() else 1


if __name__ == "__main__":
    raise SystemExit(main())
