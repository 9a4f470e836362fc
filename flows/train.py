"""Train flow: training set through the model's FeatureService, fit, evaluate on a later slice,
log to MLflow with signature, input example, explicit requirements and lineage, register a version."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import mlflow
import pandas as pd
import sklearn
from mlflow import MlflowClient
from mlflow.models import infer_signature
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from feature_repo import store as feature_store
from feature_repo import synthetic
from flows import data_validation, training
from serving.registry import versions
from serving.settings import PROJECT_DIR, Settings

EXPERIMENT = "tollfree-fraud"
# The sklearn flavor's default (skops) refuses tree models unless their types are trusted.
SKOPS_TRUSTED_TYPES = ["sklearn.tree._tree.Tree"]


@task
def build_training_sets(data_dir: Path, home: Path, service_name: str) -> dict[str, Any]:
    transactions = synthetic.read_transactions(data_dir)
    customers = pd.read_parquet(data_dir / "customers.parquet", columns=["customer_id", training.SENSITIVE_ATTRIBUTE])
    split = training.TimeSplit.for_span(
        transactions["event_timestamp"].min().to_pydatetime(), transactions["event_timestamp"].max().to_pydatetime()
    )
    train_rows, eval_rows = training.split_rows(transactions, split)
    store = feature_store.open_store(home)
    names = feature_store.feature_names(feature_store.feature_service(store, service_name))
    sets = {}
    for label, rows in (("train", train_rows), ("eval", eval_rows)):
        frame = training.historical_features(store, service_name, training.entity_frame(rows))
        frame[training.LABEL] = rows[training.LABEL].to_numpy()
        frame = frame.merge(customers, on="customer_id", how="left")
        sets[label] = frame
    return {"train": sets["train"], "eval": sets["eval"], "features": names, "split": split}


@task
def validate_training_data(sets: dict[str, Any]) -> data_validation.ValidationSummary:
    """The training frame against its Great Expectations suite; the data gate reads the result."""
    summary = data_validation.validate_frame(sets["train"], sets["features"], label=training.LABEL)
    create_table_artifact(
        key="training-data-validation",
        table=summary.table(),
        description=f"Great Expectations suite {summary.suite}: {'passed' if summary.success else 'FAILED'}",
    )
    return summary


@task
def fit_and_log(
    sets: dict[str, Any],
    settings: Settings,
    model_name: str,
    service_name: str,
    seed: int,
    alias: str,
    validation: data_validation.ValidationSummary,
    hyperparameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    names: list[str] = sets["features"]
    train, evaluation = sets["train"], sets["eval"]
    model = training.fit(train[names], train[training.LABEL], seed, **(hyperparameters or {}))
    scores = model.predict_proba(evaluation[names])[:, 1]
    metrics = training.evaluate(evaluation[training.LABEL], scores)
    metrics["train_rows"] = float(len(train))

    mlflow.set_tracking_uri(settings.tracking_uri)
    client = MlflowClient(settings.tracking_uri)
    experiment_id = versions.ensure_experiment(client, EXPERIMENT, settings.artifacts_dir)
    commit = training.git_commit(PROJECT_DIR)
    split = sets["split"]
    with mlflow.start_run(experiment_id=experiment_id) as run:
        mlflow.log_params(
            {
                "model_class": type(model).__name__,
                "n_estimators": model.n_estimators,
                "max_depth": model.max_depth,
                "learning_rate": model.learning_rate,
                "seed": seed,
                "feature_service": service_name,
                "train_start": split.train_start.isoformat(),
                "eval_start": split.eval_start.isoformat(),
                "eval_end": split.eval_end.isoformat(),
                "labels_as_of": split.as_of.isoformat(),
            }
        )
        mlflow.log_metrics(metrics)
        mlflow.set_tags({"feature_service": service_name, "tollfree.git_commit": commit, **validation.as_tags()})
        _log_data(train, evaluation, names, service_name, settings)
        example = train[names].head(3)
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            signature=infer_signature(example, model.predict_proba(example)),
            input_example=example,
            pip_requirements=[f"scikit-learn=={sklearn.__version__}", f"mlflow=={mlflow.__version__}"],
            pyfunc_predict_fn="predict_proba",
            skops_trusted_types=SKOPS_TRUSTED_TYPES,
            registered_model_name=model_name,
            metadata={"feature_service": service_name},
        )
    version = str(info.registered_model_version)
    client.set_model_version_tag(model_name, version, "feature_service", service_name)
    client.set_model_version_tag(model_name, version, "tollfree.git_commit", commit)
    for key, value in validation.as_tags().items():
        client.set_model_version_tag(model_name, version, key, value)
    client.set_registered_model_alias(model_name, alias, version)
    return {
        "run_id": run.info.run_id,
        "version": version,
        "metrics": metrics,
        "model_uri": versions.model_uri(model_name, alias),
    }


def _log_data(
    train: pd.DataFrame, evaluation: pd.DataFrame, names: list[str], service_name: str, settings: Settings
) -> None:
    """The active run's data: the training rows as its MLflow input, and as artifacts the training rows (the
    drift reference) and the held-out rows (what the promote flow's gates score)."""
    dataset = mlflow.data.from_pandas(
        train[[training.ROW_KEY, *names, training.LABEL]],
        source=str(settings.data_dir / "transactions.parquet"),
        name=f"{service_name}-train",
        targets=training.LABEL,
    )
    mlflow.log_input(dataset, context="training")
    with tempfile.TemporaryDirectory() as tmp:
        reference = Path(tmp) / "train.parquet"
        train[[training.ROW_KEY, "event_timestamp", *names, training.LABEL, training.SENSITIVE_ATTRIBUTE]].to_parquet(
            reference, index=False
        )
        mlflow.log_artifact(str(reference), artifact_path="training")
        held_out = Path(tmp) / "eval.parquet"
        evaluation[
            [training.ROW_KEY, *training.REQUEST_COLUMNS, *names, training.LABEL, training.SENSITIVE_ATTRIBUTE]
        ].to_parquet(held_out, index=False)
        mlflow.log_artifact(str(held_out), artifact_path="evaluation")


@flow(name="train")
def train(
    model_name: str = "fraud",
    feature_service: str = "fraud_v1",
    seed: int = 7,
    alias: str = "candidate",
    hyperparameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit the model on point-in-time features and register a version under ``alias`` (never promotes)."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    sets = build_training_sets(settings.data_dir, settings.home, feature_service)
    validation = validate_training_data(sets)
    if not validation.success:
        logger.warning("training data failed its suite: %s", [o.expectation for o in validation.failed()])
    result = fit_and_log(sets, settings, model_name, feature_service, seed, alias, validation, hyperparameters)
    logger.info(
        "registered %s version %s as @%s: PR-AUC %.3f, ROC-AUC %.3f on %d later rows",
        model_name,
        result["version"],
        alias,
        result["metrics"]["eval_pr_auc"],
        result["metrics"]["eval_roc_auc"],
        int(result["metrics"]["eval_rows"]),
    )
    return result


def missing_inputs(settings: Settings) -> list[str]:
    """What the train flow reads and cannot find, each named with how to make it (empty: all there)."""
    missing = [
        f"{settings.data_dir / name} not found; generate the data with "
        f"`python -m feature_repo.synthetic --out {settings.data_dir}`"
        for name in (synthetic.TRANSACTIONS_FILE, synthetic.CUSTOMERS_FILE)
        if not (settings.data_dir / name).is_file()
    ]
    missing += [
        f"{settings.home / relative} not found; run the materialize flow (`python -m flows.materialize`)"
        for relative in feature_store.TABLE_PATHS.values()
        if not (settings.home / relative).is_file()
    ]
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=train.__doc__)
    parser.add_argument("--model-name", default="fraud")
    parser.add_argument("--feature-service", default="fraud_v1")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--alias", default="candidate")
    args = parser.parse_args(argv)
    missing = missing_inputs(Settings.from_environ(os.environ))
    if missing:  # said before Prefect and MLflow start: a missing file costs no server start-up
        print("training refused: " + "; ".join(missing), file=sys.stderr)
        return 2
    train(model_name=args.model_name, feature_service=args.feature_service, seed=args.seed, alias=args.alias)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
