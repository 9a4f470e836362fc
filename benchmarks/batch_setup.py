"""The batch benchmark's set-up (see benchmarks/batch.py): data, feature tables, models and inputs in a work dir.

Kept between invocations with ``--workdir``: ``setup.json`` records what is there, and what is missing is
completed (a larger input, the plain model, the features of a size not computed yet).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

MODEL = "fraud"
PLAIN_MODEL = "fraud_plain"  # the same fitted model, registered without a FeatureService
SERVICE = "fraud_v1"
COLUMNS = ["transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount"]
DAYS = 36
TXNS_PER_CUSTOMER = 2.0 * DAYS * 1.05  # the generator's mean rate, plus sprees and bursts


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def environ(home: Path, **extra: str) -> dict[str, str]:
    from serving.settings import export_defaults

    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOLLFREE_", "MLFLOW_TRACKING", "PREFECT_"))}
    env |= {
        "TOLLFREE_HOME": str(home),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
        "PREFECT_HOME": str(home / "prefect"),
        **extra,
    }
    export_defaults(env)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def set_up(work: Path, largest: int, feature_sizes: list[int], seed: int = 20267) -> dict[str, Any]:
    """Data, features, definitions, models and inputs in ``work`` (what is already there is reused)."""
    done = work / "setup.json"
    info = json.loads(done.read_text()) if done.exists() else None
    if info is not None and info["largest"] >= largest:
        log(f"reusing set-up in {work}")
    else:
        info = _set_up_world(work, largest, seed)
    home = Path(info["home"])
    os.environ.update(environ(home))
    if "plain_model_version" not in info:
        info["plain_model_version"] = _register_plain(home, info["model_version"])
    _feature_inputs(work, info, feature_sizes)
    done.write_text(json.dumps(info, indent=2))
    return info


def _set_up_world(work: Path, largest: int, seed: int) -> dict[str, Any]:
    home = work / "home"
    os.environ.update(environ(home))
    from feature_repo import aggregations, synthetic
    from feature_repo import store as feature_store

    customers = int(largest / TXNS_PER_CUSTOMER * 1.1) + 100
    started = time.perf_counter()
    now = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    config = synthetic.SyntheticConfig(
        n_customers=customers, n_merchants=2000, days=DAYS, seed=seed, start=now - timedelta(days=DAYS)
    )
    data = synthetic.generate(config)
    synthetic.write(data, home / "data")
    tx = data.transactions
    log(f"generated {len(tx)} transactions for {customers} customers in {time.perf_counter() - started:.0f} s")
    if len(tx) < largest:
        raise RuntimeError(f"generated {len(tx)} transactions, fewer than {largest}")
    started = time.perf_counter()
    tables = aggregations.feature_tables(tx, data.customers["customer_id"], data.merchants["merchant_id"])
    for name, frame in tables.items():
        feature_store.write_table(home, name, frame)
    rows = {name: len(frame) for name, frame in tables.items()}
    del tables
    store = feature_store.open_store(home)
    feature_store.apply_definitions(store)
    log(f"feature tables {rows} written and applied in {time.perf_counter() - started:.0f} s")

    version = _train_and_register(home, store, tx)
    inputs = {}
    for size in sorted({*_sizes(largest), largest}):
        path = work / f"input-{size}.parquet"
        tx.tail(size)[COLUMNS].to_parquet(path, index=False)
        inputs[str(size)] = str(path)
    return {
        "home": str(home),
        "largest": largest,
        "transactions": len(tx),
        "feature_rows": rows,
        "model_version": version,
        "inputs": inputs,
        "features": {},
        "features_parquet": {},
    }


def _sizes(largest: int) -> list[int]:
    return [s for s in (1_000_000, 10_000_000) if s <= largest]


def _train_and_register(home: Path, store: Any, tx: Any) -> str:
    """The train flow's model on 20k point-in-time rows, registered as fraud@champion with its FeatureService."""
    import mlflow
    import sklearn
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    from feature_repo import store as feature_store
    from flows import training
    from flows.train import SKOPS_TRUSTED_TYPES
    from serving.registry import versions

    started = time.perf_counter()
    middle = tx[(tx["event_timestamp"] >= tx["event_timestamp"].min() + timedelta(days=8))]
    sample = middle.sample(20_000, random_state=3)
    frame = training.historical_features(store, SERVICE, training.entity_frame(sample))
    names = feature_store.feature_names(feature_store.feature_service(store, SERVICE))
    labels = sample.set_index("transaction_id").loc[frame["transaction_id"], "is_fraud"].to_numpy()
    model = training.fit(frame[names], labels, seed=7)
    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = versions.ensure_experiment(client, "bench-batch", home / "mlartifacts")
    with mlflow.start_run(experiment_id=experiment):
        example = frame[names].head(3)
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            signature=infer_signature(example, model.predict_proba(example)),
            input_example=example,
            pip_requirements=[f"scikit-learn=={sklearn.__version__}", f"mlflow=={mlflow.__version__}"],
            pyfunc_predict_fn="predict_proba",
            skops_trusted_types=SKOPS_TRUSTED_TYPES,
            registered_model_name=MODEL,
            metadata={"feature_service": SERVICE},
        )
    version = str(info.registered_model_version)
    client.set_model_version_tag(MODEL, version, "feature_service", SERVICE)
    client.set_registered_model_alias(MODEL, "champion", version)
    log(f"trained and registered {MODEL} v{version} in {time.perf_counter() - started:.0f} s")
    return version


def _register_plain(home: Path, version: str) -> str:
    """The champion's fitted model logged again, same signature, without a FeatureService: ``fraud_plain``.

    The same estimator object (loaded back from the champion's artifacts), so both tollfree rows and
    ``mlflow models predict`` score the same model; only the registry entry differs (no
    ``feature_service`` tag or metadata), which makes tollfree score the input's own columns.
    """
    import mlflow
    import sklearn
    from mlflow import MlflowClient

    from flows.train import SKOPS_TRUSTED_TYPES
    from serving.registry import versions

    uri = f"sqlite:///{home / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    source = f"models:/{MODEL}/{version}"
    model = mlflow.sklearn.load_model(source)
    signature = mlflow.models.get_model_info(source).signature
    experiment = versions.ensure_experiment(client, "bench-batch", home / "mlartifacts")
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.sklearn.log_model(
            model,
            name="model",
            signature=signature,
            pip_requirements=[f"scikit-learn=={sklearn.__version__}", f"mlflow=={mlflow.__version__}"],
            pyfunc_predict_fn="predict_proba",
            skops_trusted_types=SKOPS_TRUSTED_TYPES,
            registered_model_name=PLAIN_MODEL,
        )
    log(f"registered the same fitted model as {PLAIN_MODEL} v{info.registered_model_version} (no FeatureService)")
    return str(info.registered_model_version)


def _feature_inputs(work: Path, info: dict[str, Any], sizes: list[int]) -> None:
    """For each size (and 10 rows, mlflow's start-up), the last N rows' features.

    CSV (the model's columns) for mlflow, parquet (row key, timestamp and the model's columns) for tollfree.
    """
    import pandas as pd

    from feature_repo import store as feature_store

    info.setdefault("features", {})
    info.setdefault("features_parquet", {})
    wanted = [
        s for s in sorted({10, *sizes}) if str(s) not in info["features"] or str(s) not in info["features_parquet"]
    ]
    if not wanted:
        return
    largest = pd.read_parquet(info["inputs"][str(info["largest"])])
    store = feature_store.open_store(Path(info["home"]))
    for size in wanted:
        started = time.perf_counter()
        csv, parquet = work / f"features-{size}.csv", work / f"features-{size}.parquet"
        _feature_files(store, largest.tail(size), csv, parquet)
        info["features"][str(size)] = str(csv)
        info["features_parquet"][str(size)] = str(parquet)
        log(f"features of the last {size} rows computed in {time.perf_counter() - started:.0f} s")


def _feature_files(store: Any, rows: Any, csv: Path, parquet: Path, chunk: int = 250_000) -> None:
    """The model's input columns for ``rows``, built in chunks: CSV (as mlflow models predict reads it) and
    parquet with the row key and ``event_timestamp`` too (tollfree's features-given input), same rows, same order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from feature_repo import store as feature_store
    from flows import training

    names = feature_store.feature_names(feature_store.feature_service(store, SERVICE))
    columns = list(dict.fromkeys(["transaction_id", "event_timestamp", *names]))
    writer = None
    try:
        with csv.open("w") as out:
            for i, start in enumerate(range(0, len(rows), chunk)):
                frame = training.historical_features(
                    store, SERVICE, training.entity_frame(rows.iloc[start : start + chunk])
                )
                frame[names].to_csv(out, index=False, header=i == 0)
                table = pa.Table.from_pandas(frame[columns], preserve_index=False)
                if writer is None:
                    writer = pq.ParquetWriter(parquet, table.schema)
                writer.write_table(table.cast(writer.schema))
    finally:
        if writer is not None:
            writer.close()
