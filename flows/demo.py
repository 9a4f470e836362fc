"""The main job on embedded defaults: one thin, real pass through every stage.

``python -m flows.demo`` (what ``make demo`` runs): data -> features -> train -> serve over HTTP ->
batch score -> drift report. All state lands in ``TOLLFREE_HOME`` (default ``.tollfree/``).
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import statistics
import time
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
from prefect import flow, get_run_logger, task

from feature_repo import synthetic
from flows.batch_score import batch_score
from flows.materialize import materialize
from flows.promote import promote
from flows.skew import skew
from flows.train import train
from serving.gateway.process import environ_with, start_gateway, wait_endpoint_ready, wait_endpoint_settled
from serving.settings import Settings

ENDPOINT = "fraud"

# Warnings raised inside third-party libraries that a person running the demo can neither act on nor should have to
# read (their deprecations of their own internals, Feast's note that on-demand views are experimental, MLflow's
# schema hints). Filtered for the demo's own run only: the tests keep them (pyproject.toml's filterwarnings).
THIRD_PARTY = ("evidently", "litestar", "ibis", "great_expectations", "mlflow", "feast", "sqlalchemy", "dask")
QUIET_LOGGERS = ("mlflow.utils.environment",)


def _fresh(data_dir: Path, today: datetime) -> bool:
    if not (data_dir / "transactions.parquet").exists():
        return False
    last = synthetic.read_transactions(data_dir)["event_timestamp"].max()
    return bool(last >= pd.Timestamp(today) - pd.Timedelta(days=2))


@task
def ensure_data(data_dir: Path, customers: int, days: int, seed: int) -> dict[str, Any]:
    """Synthetic raw events for the ``days`` up to today (as a live system would have them).

    A data set that still ends within two days is kept; an older one is regenerated, so the features
    served now stay inside their TTL.
    """
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if not _fresh(data_dir, today):
        config = synthetic.SyntheticConfig(
            n_customers=customers, days=days, seed=seed, start=today - timedelta(days=days)
        )
        synthetic.write(synthetic.generate(config), data_dir)
    tx = synthetic.read_transactions(data_dir)
    return {
        "transactions": len(tx),
        "fraud_rate": float(tx["is_fraud"].mean()),
        "first": str(tx["event_timestamp"].min()),
        "last": str(tx["event_timestamp"].max()),
    }


@task
def last_day(data_dir: Path, dest: Path) -> Path:
    """The last day of transactions, as a batch-scoring input (keys, time, request fields)."""
    tx = synthetic.read_transactions(data_dir)
    day = tx["event_timestamp"].max().floor("D")
    rows = tx.loc[
        tx["event_timestamp"] >= day, ["transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount"]
    ]
    dest.parent.mkdir(parents=True, exist_ok=True)
    rows.to_parquet(dest, index=False)
    return dest


@task
def serve_and_query(settings: Settings, token: str, model_name: str, requests: int) -> dict[str, Any]:
    """Start the gateway, create the endpoint on the champion, send real HTTP requests, stop it."""
    logger = get_run_logger()
    env = environ_with({"TOLLFREE_TOKEN": token})
    gateway = start_gateway(env, settings.home / "logs" / "gateway-demo.log")
    headers = {"Authorization": f"Bearer {token}"}
    try:
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=30) as client:
            existing = client.get(f"/api/2.0/serving-endpoints/{ENDPOINT}")
            config = {"served_entities": [{"entity_name": model_name, "entity_alias": "champion"}]}
            if existing.status_code == 404:
                client.post("/api/2.0/serving-endpoints", json={"name": ENDPOINT, "config": config}).raise_for_status()
            else:  # a gateway started on the last run's state first restores the endpoint: change it after that
                wait_endpoint_settled(gateway.url, token, ENDPOINT)
                client.put(f"/api/2.0/serving-endpoints/{ENDPOINT}/config", json=config).raise_for_status()
            started = time.monotonic()
            view = wait_endpoint_ready(gateway.url, token, ENDPOINT)
            logger.info(
                "endpoint %s READY in %.1fs serving %s",
                ENDPOINT,
                time.monotonic() - started,
                [e.get("name") for e in view["config"]["served_entities"]],
            )
            tx = synthetic.read_transactions(settings.data_dir)
            sample = tx.tail(requests)[["customer_id", "merchant_id", "amount"]]
            latencies, frauds, served_by = [], 0, set()
            for row in sample.to_dict("records"):
                t0 = time.perf_counter()
                reply = client.post(f"/serving-endpoints/{ENDPOINT}/invocations", json={"dataframe_records": [row]})
                latencies.append((time.perf_counter() - t0) * 1000)
                reply.raise_for_status()
                served_by.add(reply.headers["served-model-name"])
                frauds += reply.json()["predictions"][0][1] >= 0.5
            bad = client.post(
                f"/serving-endpoints/{ENDPOINT}/invocations",
                json={"dataframe_records": [{"customer_id": 10**9, "merchant_id": 1, "amount": 5.0}]},
            )
    finally:
        gateway.stop()
    latencies.sort()
    return {
        "url": gateway.url,
        "requests": len(latencies),
        "served_by": sorted(served_by),
        "flagged": int(frauds),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[int(0.99 * (len(latencies) - 1))],
        "unknown_entity_status": bad.status_code,
    }


@flow(name="demo")
def demo(
    customers: int = 1000, days: int = 42, requests: int = 300, seed: int = 7, model_name: str = "fraud"
) -> dict[str, Any]:
    """Data -> features -> train -> serve -> batch score -> drift, on embedded defaults."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    token = os.environ.get("TOLLFREE_TOKEN") or secrets.token_urlsafe(24)
    data = ensure_data(settings.data_dir, customers, days, seed)
    logger.info("data: %s", data)
    features = materialize()
    trained = train(model_name=model_name, alias="candidate")
    promoted = promote(model_name=model_name, version=trained["version"])
    served = serve_and_query(settings, token, model_name, requests)
    logger.info("served %d requests: p50 %.1f ms, p99 %.1f ms", served["requests"], served["p50_ms"], served["p99_ms"])
    batch_input = last_day(settings.data_dir, settings.batch_dir / "input" / "last_day.parquet")
    scored = batch_score(
        input_path=str(batch_input),
        output=str(settings.batch_dir / "output"),
        model_uri=f"models:/{model_name}@champion",
        run_id="demo",
    )
    drift = skew(endpoint=ENDPOINT, fail_on_finding=False)
    return {
        "data": data,
        "features": features,
        "trained": trained,
        "promoted": promoted,
        "served": served,
        "batch": scored,
        "drift": drift,
    }


def summary(result: dict[str, Any], settings: Settings, seconds: float) -> str:
    t, p, s, b, d = result["trained"], result["promoted"], result["served"], result["batch"], result["drift"]
    reports = [v["report"] for v in d.get("versions", {}).values()]
    lines = [
        "",
        f"tollfree demo finished in {seconds:.0f}s (state in {settings.home})",
        f"  data       {result['data']['transactions']} transactions, {result['data']['fraud_rate']:.1%} fraud, "
        f"{result['data']['first'][:10]} .. {result['data']['last'][:10]}",
        f"  features   {result['features']['rows']} rows written; online store loaded",
        f"  train      registered fraud v{t['version']} @candidate: PR-AUC {t['metrics']['eval_pr_auc']:.3f}, "
        f"ROC-AUC {t['metrics']['eval_roc_auc']:.3f} on the later slice (run {t['run_id']})",
        f"  promote    v{p['version']} passed {len(p['gates'])} gates -> @{p['alias']}: "
        + "; ".join(f"{g['gate']} {g['value']}" for g in p["gates"] if g["gate"] in ("latency", "fairness")),
        f"  serve      {s['requests']} HTTP requests via {s['url']} served by {s['served_by']}: "
        f"p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; {s['flagged']} flagged; "
        f"unknown customer -> HTTP {s['unknown_entity_status']}",
        f"  batch      {b['rows']} rows scored -> {b['output']}",
        f"  monitor    {d.get('verdict')}: {d.get('versions', {})}",
        "",
        "Where to look:",
        f"  MLflow UI      MLFLOW_TRACKING_URI={settings.tracking_uri} .venv/bin/mlflow ui --port 5000",
        f"  Prefect UI     PREFECT_HOME={settings.prefect_home} .venv/bin/prefect server start",
        f"  drift report   {reports[0] if reports else '(not enough served rows)'}",
        f"  inference log  {settings.inference_log_dir}",
        f"  replica logs   {settings.home / 'logs'}",
    ]
    return "\n".join(lines)


def quiet_third_party_warnings() -> None:
    """Ignore every warning attributed to a module of a ``THIRD_PARTY`` package, those loggers' warnings and MLflow's
    download progress bars."""
    pattern = rf"({'|'.join(THIRD_PARTY)})(\.|$)"
    warnings.filterwarnings("ignore", module=pattern)
    # A warning raised while a module is compiled (an invalid escape sequence) names its file, not its module.
    warnings.filterwarnings("ignore", module=r".*[/\\]site-packages[/\\]")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def main(argv: list[str] | None = None) -> int:
    quiet_third_party_warnings()
    parser = argparse.ArgumentParser(description=demo.__doc__)
    parser.add_argument("--customers", type=int, default=1000)
    parser.add_argument("--days", type=int, default=42)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args(argv)
    started = time.monotonic()
    result = demo(customers=args.customers, days=args.days, requests=args.requests)
    print(summary(result, Settings.from_environ(os.environ), time.monotonic() - started))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
