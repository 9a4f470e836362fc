"""Batch scoring throughput and peak memory: tollfree vs a naive pandas script vs `mlflow models predict`.

    python -m benchmarks.batch [--sizes 1000000,10000000] [--naive-sizes ...] [--features-sizes 1000000]
                               [--mlflow-sizes 1000000] [--chunk-rows N] [--workdir DIR] [--setup-only] [--json]

Set-up (benchmarks/batch_setup.py; once per work dir, ``--workdir`` keeps it between invocations and
completes what is missing):
synthetic data from ``feature_repo.synthetic`` large enough for the biggest size, the feature tables
from ``feature_repo.aggregations``, the Feast definitions applied (DuckDB offline store), a GBDT (100
trees of depth 3, the train flow's model) fitted on 20k point-in-time rows and registered as
``fraud@champion`` with its FeatureService, and the same fitted model logged again with the same
signature but no FeatureService as ``fraud_plain``. Entity-key inputs are the last N transactions
(row key, entity keys, amount, timestamp) as parquet. Features inputs are the same rows' point-in-time
features, computed beforehand (untimed): CSV (the model's columns) for ``mlflow models predict``,
parquet (row key, ``event_timestamp`` and the model's columns) for tollfree, same rows, same order.

Rows (each selectable by its sizes option; an empty list skips it):

    tollfree (local, entity keys)     --sizes           fraud@champion, features joined through Feast
    naive pandas script               --naive-sizes     the entity-key input, one join for everything
    tollfree (local, features given)  --features-sizes  fraud_plain on the features parquet
    limit                             (with each features size) benchmarks.batch_limit on the same parquet
    mlflow models predict             --mlflow-sizes    models:/fraud/V on the features CSV

Every measured run is a fresh process started by a small wrapper that reports the wall time and the
peak RSS of its children (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the largest single descendant,
e.g. the scorer, not the sum with Prefect's API server). Rows/s is rows over the process's wall
time, start-up included; ``work rows/s`` excludes the fixed start-up where the tool reports it
(tollfree: the flow's own timing; naive: its own timing; mlflow: wall minus the wall of the same
command on 10 rows).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.batch_setup import MODEL, PLAIN_MODEL, SERVICE, environ, log, set_up

PROJECT = Path(__file__).resolve().parent.parent
TARGETS = {"vs_mlflow": 5.0, "vs_naive": 1.0, "rss_10m_over_1m": 1.5, "over_limit": 2.0}
LIMIT = "limit (read + predict on every core + write)"

WRAPPER = """
import json, resource, subprocess, sys, time
import psutil
started = time.perf_counter()
cap_mb = float(sys.argv[2])
tree_peak = 0.0
with open(sys.argv[1], "w") as out:
    child = subprocess.Popen(sys.argv[3:], stdout=out)
    parent = psutil.Process(child.pid)
    over = False
    while child.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs) / 2**20
        except psutil.Error:
            rss = 0.0
        tree_peak = max(tree_peak, rss)
        if rss > cap_mb:
            over = True
            for p in reversed(procs):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        time.sleep(0.2)
print(json.dumps({"code": child.returncode, "wall": time.perf_counter() - started, "over_cap": over,
                  "tree_peak_mb": tree_peak,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


# --- the naive anchor ---------------------------------------------------------------------------


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


# --- measuring ----------------------------------------------------------------------------------


def measure(cmd: list[str], env: dict[str, str], timeout: float, cap_mb: float) -> dict[str, Any]:
    """Wall time and peak RSS of ``cmd`` in a fresh wrapper process (killed above ``cap_mb``); its stdout is kept."""
    out_file = Path(tempfile.mkstemp(prefix="bench-batch-", suffix=".out")[1])
    wrapper = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(out_file), str(cap_mb), *cmd],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = wrapper.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(wrapper.pid, signal.SIGKILL)  # the wrapper and the measured process tree
        wrapper.communicate()
        raise
    done = subprocess.CompletedProcess(wrapper.args, wrapper.returncode, stdout, stderr)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"measurement failed for {cmd[:4]}: {done.stderr[-2000:]}") from exc
    result["stdout"] = out_file.read_text()
    out_file.unlink()
    if result["over_cap"]:
        raise RuntimeError(f"killed above the memory cap of {cap_mb:.0f} MB (--cap-mb)")
    if result["code"] != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:4])} ... exited {result['code']}: {result['stdout'][-2000:]} {done.stderr[-2000:]}"
        )
    return result


@contextlib.contextmanager
def prefect_server(home: Path, env: dict[str, str]) -> Iterator[str]:
    """A Prefect API server on 127.0.0.1, as a deployment would have (no temporary server per run)."""
    import httpx

    from serving.replicas.local import free_port

    port = free_port()
    log_file = (home / "prefect-server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if server.poll() is not None:
                raise RuntimeError(f"prefect server exited; see {log_file.name}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(30)
        if server.poll() is None:
            server.kill()
        log_file.close()


ENTITY_KEYS = "tollfree (local, entity keys)"
FEATURES_GIVEN = "tollfree (local, features given)"
NAIVE = "naive pandas script"
MLFLOW = "mlflow models predict"


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(s) for s in args.sizes.split(",") if s]
    feature_sizes = [int(s) for s in args.features_sizes.split(",") if s]
    mlflow_sizes = [int(s) for s in args.mlflow_sizes.split(",") if s]
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tollfree-bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        info = set_up(
            work,
            max([*sizes, *feature_sizes, *mlflow_sizes], default=1_000_000),
            sorted({*feature_sizes, *mlflow_sizes}),
        )
        home = Path(info["home"])
        env = environ(home)
        results: list[dict[str, Any]] = []
        if args.setup_only:
            return {"setup": _setup_summary(info), "results": [], "verdicts": [], "chunk_rows": args.chunk_rows}
        with prefect_server(home, env) if sizes or feature_sizes else contextlib.nullcontext("") as api:
            flow_env = env | {"PREFECT_API_URL": api}
            for size in sizes:
                source = info["inputs"][str(size)]
                results.append(_tollfree(ENTITY_KEYS, work, source, f"models:/{MODEL}@champion", size, args, flow_env))
                if args.dask:
                    results.append(
                        _tollfree(
                            "tollfree (dask, 2 workers, entity keys)",
                            work,
                            source,
                            f"models:/{MODEL}@champion",
                            size,
                            args,
                            flow_env,
                            dask=True,
                        )
                    )
                if size in args.naive_sizes:
                    log(f"naive pandas, {size} rows")
                    try:
                        m = measure(
                            [
                                sys.executable,
                                "-m",
                                "benchmarks.batch",
                                "naive",
                                "--input",
                                source,
                                "--output",
                                str(work / "naive.parquet"),
                            ],
                            env,
                            args.timeout,
                            args.cap_mb,
                        )
                        naive_out = json.loads(m["stdout"].strip().splitlines()[-1])
                        results.append(_row(NAIVE, size, m, naive_out["seconds"], naive_out["rows"]))
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        results.append({"tool": NAIVE, "rows": size, "error": str(exc)[:300]})
                    log(f"  {results[-1]}")
                    (work / "naive.parquet").unlink(missing_ok=True)
            for size in feature_sizes:
                plain = f"models:/{PLAIN_MODEL}/{info['plain_model_version']}"
                results.append(
                    _tollfree(FEATURES_GIVEN, work, info["features_parquet"][str(size)], plain, size, args, flow_env)
                )
                results.append(_limit(work, info["features_parquet"][str(size)], plain, size, args, env))
            overhead = None
            for size in sorted({10, *mlflow_sizes}) if mlflow_sizes else []:
                log(f"mlflow models predict, {size} rows")
                m = measure(
                    [
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
                        str(work / "mlflow-out.json"),
                        "--env-manager",
                        "local",
                    ],
                    env,
                    args.timeout,
                    args.cap_mb,
                )
                if size == 10:
                    overhead = m["wall"]
                    continue
                results.append(_row(MLFLOW, size, m, m["wall"] - (overhead or 0.0), size))
                log(f"  {results[-1]}")
                (work / "mlflow-out.json").unlink(missing_ok=True)
        return {
            "setup": _setup_summary(info),
            "results": results,
            "verdicts": verdicts(results),
            "chunk_rows": args.chunk_rows,
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()},
        }
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _setup_summary(info: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in info.items() if k not in ("inputs", "features", "features_parquet")}


def _tollfree(
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
    row = _row(tool, size, m, manifest.get("seconds"), manifest["rows"])
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


def _limit(
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
    row = _row(LIMIT, size, m, out["seconds"], out["rows"])
    row["stage_seconds"] = {k.removesuffix("_s"): out[k] for k in ("read_s", "predict_s", "write_s")}
    log(f"  {row}")
    return row


def _row(tool: str, rows: int, m: dict[str, Any], work_s: float | None, scored: int) -> dict[str, Any]:
    return {
        "tool": tool,
        "rows": rows,
        "scored": scored,
        "wall_s": round(m["wall"], 2),
        "rows_per_s": round(rows / m["wall"]),
        "work_s": round(work_s, 2) if work_s else None,
        "work_rows_per_s": round(rows / work_s) if work_s else None,
        "peak_rss_mb": round(m["maxrss_mb"]),
        "tree_peak_mb": round(m["tree_peak_mb"]),
    }


def verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def pick(tool: str, rows: int) -> dict[str, Any] | None:
        return next((r for r in results if r["tool"] == tool and r["rows"] == rows and "error" not in r), None)

    out = []
    mlflow = [r for r in results if r["tool"] == MLFLOW and "error" not in r]
    if mlflow:
        best = max(mlflow, key=lambda r: r["rows"])
        for r in sorted((r for r in results if r["tool"] == FEATURES_GIVEN), key=lambda r: r["rows"]):
            for key in ("rows_per_s", "work_rows_per_s"):
                if r.get(key) and best.get(key):
                    ratio = r[key] / best[key]
                    out.append(
                        {
                            "target": f"{FEATURES_GIVEN} {key} vs {MLFLOW} ({best['rows']} rows)",
                            "rows": r["rows"],
                            "ratio": round(ratio, 2),
                            "need": TARGETS["vs_mlflow"],
                            "pass": ratio >= TARGETS["vs_mlflow"],
                        }
                    )
    for r in (r for r in results if r["tool"] == FEATURES_GIVEN and r.get("work_s")):
        bound = pick(LIMIT, r["rows"])
        if bound and bound.get("work_s"):
            ratio = r["work_s"] / bound["work_s"]
            out.append(
                {
                    "target": f"{FEATURES_GIVEN} work s over the {LIMIT}",
                    "rows": r["rows"],
                    "ratio": round(ratio, 2),
                    "need": f"<= {TARGETS['over_limit']}",
                    "pass": ratio <= TARGETS["over_limit"],
                }
            )
    ours = {r["rows"]: r for r in results if r["tool"] == ENTITY_KEYS}
    for rows, r in sorted(ours.items()):
        n = pick(NAIVE, rows)
        failed = next((x for x in results if x["tool"] == NAIVE and x["rows"] == rows and "error" in x), None)
        if failed:
            out.append(
                {
                    "target": f"{ENTITY_KEYS} rows_per_s vs {NAIVE}",
                    "rows": rows,
                    "ratio": "naive did not finish",
                    "need": TARGETS["vs_naive"],
                    "pass": True,
                    "note": failed["error"],
                }
            )
        if n:
            ratio = r["rows_per_s"] / n["rows_per_s"]
            out.append(
                {
                    "target": f"{ENTITY_KEYS} rows_per_s vs {NAIVE}",
                    "rows": rows,
                    "ratio": round(ratio, 2),
                    "need": TARGETS["vs_naive"],
                    "pass": ratio >= TARGETS["vs_naive"],
                }
            )
    for tool in (ENTITY_KEYS, FEATURES_GIVEN):
        mine = {r["rows"]: r for r in results if r["tool"] == tool}
        if 1_000_000 in mine and 10_000_000 in mine:
            ratio = mine[10_000_000]["peak_rss_mb"] / mine[1_000_000]["peak_rss_mb"]
            out.append(
                {
                    "target": f"{tool} peak RSS 10M / 1M",
                    "rows": 10_000_000,
                    "ratio": round(ratio, 2),
                    "need": f"<= {TARGETS['rss_10m_over_1m']}",
                    "pass": ratio <= TARGETS["rss_10m_over_1m"],
                }
            )
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'tool':34} {'rows':>10} {'wall s':>8} {'rows/s':>9} {'work s':>8} {'work rows/s':>11} {'peak RSS MB':>11} "
        f"{'tree RSS MB':>11}"
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['tool']:34} {r['rows']:>10} failed: {r['error'][:120]}")
            continue
        lines.append(
            f"{r['tool']:34} {r['rows']:>10} {r['wall_s']:>8.1f} {r['rows_per_s']:>9} "
            f"{r['work_s'] if r['work_s'] is not None else '-':>8} {r['work_rows_per_s'] or '-':>11} {r['peak_rss_mb']:>11} "
            f"{r['tree_peak_mb']:>11}"
        )
    lines.append("")
    for r in report["results"]:
        if r.get("stage_seconds"):
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items())
            lines.append(
                f"{r['tool']} {r['rows']} rows, chunks of {r.get('chunk_rows') or '-'}: stage seconds {stages}"
            )
    if "machine" in report:
        lines.append(f"load average at the end: {' '.join(f'{x:.1f}' for x in report['machine']['loadavg'])}")
    lines.append("")
    for v in report["verdicts"]:
        lines.append(
            f"{'PASS' if v['pass'] else 'FAIL'}  {v['target']} at {v['rows']} rows: {v['ratio']} (need {v['need']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("naive", help="(internal) the naive anchor, run in its own process")
    child.add_argument("--input", type=Path, required=True)
    child.add_argument("--output", type=Path, required=True)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--naive-sizes", default="1000000,10000000")
    parser.add_argument(
        "--features-sizes",
        default="1000000",
        help="tollfree on the features input mlflow models predict gets (model registered without FeatureService)",
    )
    parser.add_argument(
        "--mlflow-sizes", default="1000000", help="mlflow models predict sizes (plus 10 rows for its start-up)"
    )
    parser.add_argument("--chunk-rows", type=int, default=0, help="tollfree --chunk-rows (default: the flow's default)")
    parser.add_argument(
        "--setup-only", action="store_true", help="build (or complete) the set-up in --workdir and stop"
    )
    parser.add_argument("--dask", action="store_true", help="also run the Dask engine (LocalCluster, 2 workers)")
    parser.add_argument("--workdir", default=None, help="keep the set-up here and reuse it")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--cap-mb", type=float, default=12_000, help="kill a measured run whose process tree exceeds this RSS"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "naive":
        naive(args.input, args.output)
        return 0
    args.naive_sizes = [int(s) for s in args.naive_sizes.split(",") if s]
    report = run_benchmark(args)
    print(json.dumps(report, indent=2) if args.json else table(report))
    if args.json:
        print(table(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
