"""The batch benchmark's runs, one function a row of its table, each in a fresh measured process.

The naive anchor is here too: ``python -m benchmarks.batch naive`` runs it in its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.batch_measure import measure
from benchmarks.batch_report import LIMIT, MLFLOW, NAIVE, result_row
from benchmarks.batch_setup import MODEL, SERVICE, log


def naive(input_path: Path, output: Path) -> None:
    """Read everything, one get_historical_features for all rows, predict, write one file."""
    import mlflow.pyfunc
    import pandas as pd

    from feature_repo import store as feature_store
    from serving.settings import Settings

    started = time.perf_counter()
    settings = Settings.from_environ(os.environ)
    store = feature_store.open_store(settings.home)
    service = store.get_feature_service(SERVICE)
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    names = model.metadata.get_input_schema().input_names()
    rows = pd.read_parquet(input_path)
    rows["event_timestamp"] = pd.to_datetime(rows["event_timestamp"], utc=True).dt.floor("us")
    features = store.get_historical_features(entity_df=rows, features=service).to_df()
    features["prediction"] = model.predict(features[names])[:, 1]
    features[["transaction_id", "event_timestamp", "prediction"]].to_parquet(output, index=False)
    print(json.dumps({"seconds": time.perf_counter() - started, "rows": len(features)}))


def naive_run(work: Path, source: str, size: int, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The naive anchor on the entity-key input, in a fresh process; a failure (e.g. the memory cap) is a row too."""
    log(f"naive pandas, {size} rows")
    output = work / "naive.parquet"
    cmd = [sys.executable, "-m", "benchmarks.batch", "naive", "--input", source, "--output", str(output)]
    try:
        m = measure(cmd, env, args.timeout, args.cap_mb)
        out = json.loads(m["stdout"].strip().splitlines()[-1])
        result = result_row(NAIVE, size, m, out["seconds"], out["rows"])
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        result = {"tool": NAIVE, "rows": size, "error": str(exc)[:300]}
    log(f"  {result}")
    output.unlink(missing_ok=True)
    return result


def tollfree(
    tool: str,
    work: Path,
    source: str,
    model_uri: str,
    size: int,
    args: argparse.Namespace,
    env: dict[str, str],
    dask: bool = False,
) -> dict[str, Any]:
    """One ``flows.batch_score`` run in a fresh process; its output is deleted afterwards."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    log(f"{tool}, {size} rows, load average {os.getloadavg()[0]:.1f}")
    cmd = [
        sys.executable,
        "-m",
        "flows.batch_score",
        "--input",
        source,
        "--output",
        str(out),
        "--model-uri",
        model_uri,
        "--run-id",
        f"bench-{size}",
    ]
    if args.chunk_rows:
        cmd += ["--chunk-rows", str(args.chunk_rows)]
    if dask:
        cmd += ["--engine", "dask", "--dask-workers", "2"]
    m = measure(cmd, env, args.timeout, args.cap_mb)
    run = out / f"run=bench-{size}"
    manifest = json.loads((run / "_SUCCESS").read_text())
    row = result_row(tool, size, m, manifest.get("seconds"), manifest["rows"])
    row["stage_seconds"] = {
        "check": manifest.get("check_seconds"),
        "chunks (wall)": manifest.get("chunks_seconds"),
        "verdict wait": manifest.get("verdict_wait_seconds"),
        **(manifest.get("stage_seconds") or {}),
    }
    row["chunk_rows"] = manifest.get("chunk_rows")
    log(f"  {row}")
    shutil.rmtree(out, ignore_errors=True)
    return row


def limit(
    work: Path, source: str, model_uri: str, size: int, args: argparse.Namespace, env: dict[str, str]
) -> dict[str, Any]:
    """``benchmarks.batch_limit`` on the features-given row's input, in a fresh process."""
    log(f"limit, {size} rows")
    m = measure(
        [
            sys.executable,
            "-m",
            "benchmarks.batch_limit",
            "--input",
            source,
            "--output",
            str(work / "limit.parquet"),
            "--model-uri",
            model_uri,
        ],
        env,
        args.timeout,
        args.cap_mb,
    )
    (work / "limit.parquet").unlink(missing_ok=True)
    out = json.loads(m["stdout"].strip().splitlines()[-1])
    row = result_row(LIMIT, size, m, out["seconds"], out["rows"])
    row["stage_seconds"] = {k.removesuffix("_s"): out[k] for k in ("read_s", "predict_s", "write_s")}
    log(f"  {row}")
    return row


def mlflow_runs(
    work: Path, info: dict[str, Any], sizes: list[int], args: argparse.Namespace, env: dict[str, str]
) -> list[dict[str, Any]]:
    """``mlflow models predict`` on the features CSV of each size; its start-up is the wall of a 10-row run."""
    results = []
    overhead = None
    for size in sorted({10, *sizes}):
        log(f"mlflow models predict, {size} rows")
        output = work / "mlflow-out.json"
        cmd = [
            str(Path(sys.executable).parent / "mlflow"),
            "models",
            "predict",
            "-m",
            f"models:/{MODEL}/{info['model_version']}",
            "-i",
            info["features"][str(size)],
            "-t",
            "csv",
            "-o",
            str(output),
            "--env-manager",
            "local",
        ]
        m = measure(cmd, env, args.timeout, args.cap_mb)
        output.unlink(missing_ok=True)
        if size == 10:
            overhead = m["wall"]
            continue
        results.append(result_row(MLFLOW, size, m, m["wall"] - (overhead or 0.0), size))
        log(f"  {results[-1]}")
    return results
