"""Promote flow: evaluate a candidate against its model's policy; every gate's result goes on the
model version as tags and into one Prefect table artifact. All gates pass: the candidate becomes
``challenger`` (or ``champion`` when there is none yet and the policy allows bootstrapping). One fails:
the run ends Failed, naming the gate, and no alias moves.

``python -m flows.promote --model fraud [--version N]``
"""

from __future__ import annotations

import argparse
import functools
import getpass
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd
from mlflow import MlflowClient
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.tasks import exponential_backoff

from feature_repo import store as feature_store
from flows import training
from flows.fan_out import artifact_key
from monitoring.fairness import group_rates
from serving.registry import gates, lifecycle, versions
from serving.registry.errors import answering
from serving.registry.promotion_policy import PromotionPolicy, load_policy, policy_for
from serving.replicas.probe import probe_model
from serving.settings import Settings

PROMOTION_POLICY_DIR = Path(__file__).resolve().parent / "promotion_policies"  # <model>.yaml, one per model
# MLflow calls retry with exponential backoff (1, 2, 4 s) before the run fails.
MLFLOW_RETRIES = {
    "retries": 3,
    "retry_delay_seconds": exponential_backoff(backoff_factor=1),
    "retry_jitter_factor": 0.2,
}


class PromotionBlocked(RuntimeError):
    """A gate failed: the candidate stays where it is."""


def _scores(model_uri: str, frame: pd.DataFrame) -> np.ndarray:
    model = mlflow.pyfunc.load_model(model_uri)
    schema = model.metadata.get_input_schema()
    columns = schema.input_names() if schema is not None else list(frame.columns)
    out = np.asarray(model.predict(frame[columns]))
    return out[:, 1] if out.ndim == 2 else out


@task(**MLFLOW_RETRIES)
def resolve_candidate(tracking_uri: str, model_name: str, version: str | None) -> dict[str, Any]:
    client = MlflowClient(tracking_uri)
    mv = versions.resolve(client, model_name, version or lifecycle.CANDIDATE, alias=not version)
    held = versions.aliases(client, model_name)
    return {
        "version": str(mv.version),
        "run_id": mv.run_id,
        "tags": dict(mv.tags),
        "champion": held.get(lifecycle.CHAMPION),
    }


@task
def held_out_rows(tracking_uri: str, run_id: str) -> pd.DataFrame:
    with tempfile.TemporaryDirectory() as tmp:
        path = MlflowClient(tracking_uri).download_artifacts(run_id, "evaluation/eval.parquet", tmp)
        return pd.read_parquet(path)


@task
def serve_and_measure(
    settings: Settings,
    model_uri: str,
    rows: pd.DataFrame,
    input_names: list[str],
    service: str | None,
    cfg: dict[str, Any],
) -> gates.ProbeFigures:
    """Serve the candidate in a real local replica and load it briefly with rows of its held-out slice.

    A model with a FeatureService is sent what a client sends (entity keys and request fields); any
    other model its signature's columns.
    """
    columns = input_names
    if service:
        store = feature_store.open_store(settings.home)
        fs = feature_store.feature_service(store, service)
        columns = [*feature_store.entity_join_keys(store, fs), *feature_store.request_fields(store, fs)]
    sample = rows[columns].head(200)
    payloads = [{"dataframe_records": [record]} for record in sample.to_dict(orient="records")]
    result = probe_model(
        model_uri,
        payloads,
        log_dir=settings.home / "logs",
        env=dict(os.environ),
        requests=int(cfg.get("requests", 150)),
        concurrency=int(cfg.get("concurrency", 4)),
    )
    return gates.ProbeFigures(
        result.requests,
        result.errors,
        result.p50_ms,
        result.p99_ms,
        result.peak_rss_mb,
        result.cpu_ms_per_prediction,
        result.artifact_mb,
    )


@task
def evaluate_gates(
    settings: Settings, policy: PromotionPolicy, candidate: dict[str, Any], model_name: str
) -> list[gates.GateResult]:
    uri = f"models:/{model_name}/{candidate['version']}"
    info = mlflow.models.get_model_info(uri)
    if info.signature is None:
        raise PromotionBlocked(
            f"{model_name} v{candidate['version']} has no signature: refused (log the model with one)"
        )
    input_names = list(info.signature.inputs.input_names())
    service = (info.metadata or {}).get("feature_service") or candidate["tags"].get("feature_service")
    rows = held_out_rows(settings.tracking_uri, candidate["run_id"])
    results: list[gates.GateResult] = []
    serving: dict[str, gates.GateResult] | None = None
    scores = None
    for name, cfg in policy.gates.items():
        if name == "quality":
            scores = _scores(uri, rows) if scores is None else scores
            metrics = training.evaluate(rows[training.LABEL], scores)
            champion = None
            if candidate["champion"] and candidate["champion"] != candidate["version"]:
                champion_uri = f"models:/{model_name}/{candidate['champion']}"
                champion = training.evaluate(rows[training.LABEL], _scores(champion_uri, rows))
            results.append(gates.quality_gate(cfg, metrics, champion))
        elif name == "fairness":
            scores = _scores(uri, rows) if scores is None else scores
            fairness = group_rates(
                rows[training.LABEL],
                scores,
                rows[cfg["attribute"]],
                threshold=float(cfg.get("score_threshold", 0.5)),
                rate=cfg.get("rate", "false_positive_rate"),
                min_rows=int(cfg.get("min_group_rows", 30)),
            )
            results.append(gates.fairness_gate(cfg, fairness))
        elif name in gates.SERVING_GATES:
            if serving is None:  # one probe (or more: see gates.serving_gates) for both gates
                probe_cfg = policy.gates.get("latency", cfg)
                measure = functools.partial(serve_and_measure, settings, uri, rows, input_names, service, probe_cfg)
                serving = gates.serving_gates(policy.gates, measure)
            results.append(serving[name])
        elif name == "data":
            results.append(gates.data_gate(cfg, candidate["tags"]))
        elif name == "compatibility":
            service_features = None
            if service:
                store = feature_store.open_store(settings.home)
                service_features = feature_store.feature_names(feature_store.feature_service(store, service))
            results.append(
                gates.compatibility_gate(
                    cfg,
                    input_names=input_names,
                    feature_service=service,
                    expected_service=policy.feature_service,
                    service_features=service_features,
                )
            )
    return results


@task(**MLFLOW_RETRIES)
def record_results(
    tracking_uri: str, model_name: str, version: str, policy: PromotionPolicy, results: list[gates.GateResult]
) -> None:
    lifecycle.record_gates(
        MlflowClient(tracking_uri), model_name, version, results, policy.path.name, datetime.now(UTC)
    )


@task(**MLFLOW_RETRIES)
def move_aliases(tracking_uri: str, model_name: str, version: str, bootstrap: bool, who: str) -> str:
    return lifecycle.admit(
        MlflowClient(tracking_uri), model_name, version, bootstrap=bootstrap, who=who, now=datetime.now(UTC)
    )


@flow(name="promote")
def promote(model_name: str = "fraud", version: str | None = None, policy_file: str | None = None) -> dict[str, Any]:
    """Gate a candidate (the ``candidate`` alias by default) and move it to ``challenger``."""
    logger = get_run_logger()
    policy = (
        load_policy(Path(policy_file)) if policy_file else policy_for(model_name, PROMOTION_POLICY_DIR)
    )  # refused before anything runs
    settings = Settings.from_environ(os.environ)
    mlflow.set_tracking_uri(settings.tracking_uri)
    with answering(settings.tracking_uri, f"gating {model_name} (no alias moved)"):
        candidate = resolve_candidate(settings.tracking_uri, model_name, version)
        results = evaluate_gates(settings, policy, candidate, model_name)
        record_results(settings.tracking_uri, model_name, candidate["version"], policy, results)
    create_table_artifact(
        key=artifact_key(f"promotion-{model_name}-v{candidate['version']}"),
        table=[r.as_row() for r in results],
        description=f"Promotion gates for {model_name} v{candidate['version']} ({policy.path.name})",
    )
    failed = [r for r in results if not r.passed]
    for r in results:
        logger.info(
            "gate %-13s %s  value %s  threshold %s  (%s)",
            r.gate,
            "PASS" if r.passed else "FAIL",
            r.value,
            r.threshold,
            r.reason,
        )
    if failed:
        raise PromotionBlocked(
            f"{model_name} v{candidate['version']} blocked by gate(s): "
            + "; ".join(f"{r.gate}: {r.reason}" for r in failed)
        )
    with answering(
        settings.tracking_uri,
        f"moving the aliases of {model_name} v{candidate['version']} "
        "(champion moves in one step and is never left missing; rerun to complete)",
    ):
        alias = move_aliases(
            settings.tracking_uri, model_name, candidate["version"], policy.bootstrap_champion, getpass.getuser()
        )
    logger.info("%s v%s passed every gate and is now @%s", model_name, candidate["version"], alias)
    return {"version": candidate["version"], "alias": alias, "gates": [r.as_row() for r in results]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=promote.__doc__)
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--version", default=None)
    parser.add_argument(
        "--policy", default=None, help="promotion policy file (default flows/promotion_policies/MODEL.yaml)"
    )
    args = parser.parse_args(argv)
    promote(model_name=args.model, version=args.version, policy_file=args.policy)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
