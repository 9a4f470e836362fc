"""Serving throughput and latency over loopback: tollfree's gateway against `mlflow models serve`.

    python -m benchmarks.serving [--seconds 10] [--concurrency 1,8,32] [--json]

One run, same models, same load generator, everything on 127.0.0.1. In a throw-away TOLLFREE_HOME two
plain sklearn models are registered (SQLite registry, no FeatureService, so every server takes the same
20 numeric columns):

  light   GradientBoostingClassifier(n_estimators=100, max_depth=3): the anchor model of the targets
  heavy   GradientBoostingClassifier(n_estimators=500, max_depth=6)

Per model, one server at a time (never two under load at once):

  mlflow-1w   mlflow models serve -m models:/NAME/1 --env-manager local (1 uvicorn worker, its default)
  mlflow-2w   the same with -w 2
  tollfree    python -m serving (the gateway; no warm pool) + endpoint "bench" (1 replica, max_concurrency
              64), requests to /serving-endpoints/bench/invocations with a bearer token; the replica
              batches concurrent requests when its load-time profile says batches pay
  tollfree-oip  the same gateway and endpoint, the same row sent to /v2/models/bench/infer as an Open
              Inference Protocol request (one FP64 input of shape [1, 20], JSON data, as tritonclient sends
              a matrix with binary data off): the v2 route's cost over the MLflow route's

Load: wrk (closed loop, keep-alive; a Lua script sets the POST body and headers), one single-row
`dataframe_split` body, for each concurrency a 2 s warm-up then --seconds timed (benchmarks/serving_servers.py
starts and stops the servers, benchmarks/serving_load.py loads and meters them). CPU-s per 1000
predictions: utime+stime of the server process and all its descendants (gateway + replica; mlflow CLI +
uvicorn + workers) from /proc over the timed window, per 2xx response. The limit: in-process
`mlflow.pyfunc.load_model(...).predict(<same single-row DataFrame>)`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Provenance, log
from benchmarks.serving_load import WARMUP_S, measure
from benchmarks.serving_servers import VENV_BIN, start_mlflow, start_tollfree, throwaway_home

SEED = 20262
FEATURES = 20
TRAIN_ROWS = 4000
MODELS = {
    "light": {"n_estimators": 100, "max_depth": 3, "label": "GBDT 100 trees, depth 3, 20 features"},
    "heavy": {"n_estimators": 500, "max_depth": 6, "label": "GBDT 500 trees, depth 6, 20 features"},
}
SERVERS = ("mlflow-1w", "mlflow-2w", "tollfree", "tollfree-oip")
INPROC_CALLS = 2000
INPROC_MAX_S = 20.0
TARGETS = {"rps_ratio_c32_min": 3.0, "p50_over_inprocess_c1_max_ms": 1.0, "oip_rps_ratio_c32_min": 0.9}
OIP_PATH = "/v2/models/bench/infer"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10, help="timed seconds per point (default 10)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated connection counts (default 1,8,32)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    args = parser.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    except ValueError:
        parser.error("--concurrency must be integers separated by commas")
    if not args.levels or min(args.levels) < 1 or max(args.levels) > 256:
        parser.error("--concurrency values must be in 1..256")
    if not 1 <= args.seconds <= 120:
        parser.error("--seconds must be in 1..120")
    return args


# --- set-up ------------------------------------------------------------------------------------------


def register_models(home: Path, tracking_uri: str) -> dict[str, Any]:
    import cloudpickle
    import mlflow
    import pandas as pd
    import sklearn
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.ensemble import GradientBoostingClassifier

    mlflow.set_tracking_uri(tracking_uri)
    client = MlflowClient(tracking_uri)
    experiment_id = client.create_experiment("bench-serving", artifact_location=(home / "artifacts").resolve().as_uri())
    rng = np.random.default_rng(SEED)
    columns = [f"f{i}" for i in range(FEATURES)]
    x = rng.normal(size=(TRAIN_ROWS, FEATURES))
    y = ((x[:, 0] + 0.5 * x[:, 1] * x[:, 2] - x[:, 3] + rng.normal(scale=0.5, size=TRAIN_ROWS)) > 0).astype(int)
    frame = pd.DataFrame(x, columns=columns)
    pip = [
        f"mlflow=={mlflow.__version__}",
        f"scikit-learn=={sklearn.__version__}",
        f"cloudpickle=={cloudpickle.__version__}",
    ]
    row = [round(float(v), 6) for v in rng.normal(size=FEATURES)]
    registered = {}
    for key, spec in MODELS.items():
        began = time.monotonic()
        model = GradientBoostingClassifier(
            n_estimators=spec["n_estimators"], max_depth=spec["max_depth"], random_state=SEED
        )
        model.fit(frame, y)
        name = f"bench-{key}"
        with mlflow.start_run(experiment_id=experiment_id):
            info = mlflow.sklearn.log_model(
                model,
                name="model",
                signature=infer_signature(frame, model.predict(frame)),
                pip_requirements=pip,
                serialization_format="cloudpickle",
                registered_model_name=name,
            )
        registered[key] = {"name": name, "version": str(info.registered_model_version), "label": spec["label"]}
        log(f"registered {name} v{info.registered_model_version} ({spec['label']}) in {time.monotonic() - began:.1f}s")
    body = json.dumps({"dataframe_split": {"columns": columns, "data": [row]}})
    oip_body = json.dumps({"inputs": [{"name": "input-0", "datatype": "FP64", "shape": [1, FEATURES], "data": row}]})
    return {"models": registered, "body": body, "oip_body": oip_body, "columns": columns, "row": row}


# --- the limit ---------------------------------------------------------------------------------------


def _in_process(model: dict[str, Any], columns: list[str], row: list[float]) -> dict[str, Any]:
    import mlflow
    import pandas as pd

    pyfunc = mlflow.pyfunc.load_model(f"models:/{model['name']}/{model['version']}")
    frame = pd.DataFrame([row], columns=columns)
    for _ in range(200):
        pyfunc.predict(frame)
    samples: list[float] = []
    deadline = time.monotonic() + INPROC_MAX_S
    cpu0 = time.process_time()
    while len(samples) < INPROC_CALLS and time.monotonic() < deadline:
        t0 = time.perf_counter_ns()
        pyfunc.predict(frame)
        samples.append(time.perf_counter_ns() - t0)
    cpu = time.process_time() - cpu0
    ms = np.asarray(samples, dtype=np.float64) / 1e6
    return {
        "server": "in-process",
        "concurrency": 1,
        "calls": len(samples),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "rps": len(samples) / (ms.sum() / 1000),
        "cpu_s_per_1000": cpu / len(samples) * 1000,
        "errors": 0,
    }


# --- run ---------------------------------------------------------------------------------------------


def _verdict(rows: list[dict[str, Any]], inproc: dict[str, Any]) -> dict[str, Any]:
    def at(server: str, c: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["server"] == server and r["concurrency"] == c), None)

    out: dict[str, Any] = {}
    tf32, ml32 = at("tollfree", 32), at("mlflow-2w", 32)
    if tf32 and ml32:
        ratio = tf32["rps"] / ml32["rps"]
        out["rps_ratio_c32"] = {
            "value": ratio,
            "target": f">= {TARGETS['rps_ratio_c32_min']}",
            "pass": ratio >= TARGETS["rps_ratio_c32_min"] and tf32["errors"] == 0,
        }
        out["p99_c32_ms"] = {
            "tollfree": tf32["p99_ms"],
            "mlflow_2w": ml32["p99_ms"],
            "target": "tollfree < mlflow-2w",
            "pass": tf32["p99_ms"] < ml32["p99_ms"],
        }
    oip32 = at("tollfree-oip", 32)
    if tf32 and oip32:
        ratio = oip32["rps"] / tf32["rps"]
        out["oip_rps_ratio_c32"] = {
            "value": ratio,
            "target": f">= {TARGETS['oip_rps_ratio_c32_min']} (tollfree-oip / tollfree)",
            "pass": ratio >= TARGETS["oip_rps_ratio_c32_min"] and oip32["errors"] == 0,
        }
    tf1 = at("tollfree", 1)
    if tf1:
        gap = tf1["p50_ms"] - inproc["p50_ms"]
        out["p50_c1_minus_inprocess_ms"] = {
            "value": gap,
            "target": f"<= {TARGETS['p50_over_inprocess_c1_max_ms']}",
            "pass": gap <= TARGETS["p50_over_inprocess_c1_max_ms"],
        }
    return out


def run(seconds: int, levels: list[int], provenance: Provenance) -> dict[str, Any]:
    """Per model, the in-process limit and every server at every concurrency; the verdicts; the run's record."""
    home = throwaway_home("tollfree-bench-serving-")
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # mlflow models serve runs the uvicorn on PATH
    try:
        setup = register_models(home, os.environ["MLFLOW_TRACKING_URI"])
        body = setup["body"]
        results = {}
        for key, model in setup["models"].items():
            log(f"model {key}: {model['label']}")
            inproc = _in_process(model, setup["columns"], setup["row"])
            log(f"  in-process  p50 {inproc['p50_ms']:.3f} ms  p99 {inproc['p99_ms']:.3f} ms ({inproc['calls']} calls)")
            bodies = {"": body, "tollfree-oip": setup["oip_body"]}
            rows, failures = _each_server(model, bodies, levels, seconds, env, home)
            results[key] = {
                "model": model,
                "in_process": inproc,
                "rows": rows,
                "failures": failures,
                "verdict": _verdict(rows, inproc),
            }
        import mlflow
        import sklearn

        return {
            **provenance.record(),
            "benchmark": "serving",
            "load_generator": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
            "loopback": "127.0.0.1",
            "seconds_per_point": seconds,
            "warmup_s": WARMUP_S,
            "concurrency": levels,
            "body": body,
            "results": results,
            "targets": TARGETS,
            "versions": {"mlflow": mlflow.__version__, "sklearn": sklearn.__version__},
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _each_server(
    model: dict[str, Any], bodies: dict[str, str], levels: list[int], seconds: int, env: dict[str, str], home: Path
) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every server in turn on ``model``: started, loaded at each level, stopped; a failure is noted, not raised.
    ``bodies``: the request each server kind gets (``""``: any other kind's)."""
    rows: list[dict[str, Any]] = []
    failures: dict[str, str] = {}
    for kind in SERVERS:
        t0 = time.monotonic()
        try:
            if kind.startswith("tollfree"):
                server = start_tollfree(model, env, home / "logs", kind=kind)
                server.path = OIP_PATH if kind == "tollfree-oip" else server.path
            else:
                server = start_mlflow(model, 1 if kind == "mlflow-1w" else 2, env, home / "logs")
        except Exception as exc:  # report and go on with the other servers
            failures[kind] = f"start: {exc}"
            log(f"  {kind}: FAILED to start: {exc}")
            continue
        log(f"  {kind} ready in {time.monotonic() - t0:.1f}s at {server.url}")
        try:
            rows += measure(server, bodies.get(kind, bodies[""]), levels, seconds, home / "post.lua")
        except Exception as exc:
            failures[kind] = f"load: {exc}"
            log(f"  {kind}: FAILED under load: {exc}")
        finally:
            server.stop()
    return rows, failures


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(result: dict[str, Any]) -> str:
    lines = [
        "| server | c | rps | p50 ms | p99 ms | errors | CPU-s / 1000 preds (server / children) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    inproc = result["in_process"]
    lines.append(
        f"| in-process pyfunc | 1 | {_fmt(inproc['rps'])} | {_fmt(inproc['p50_ms'], 2)} | "
        f"{_fmt(inproc['p99_ms'], 2)} | 0 | {_fmt(inproc['cpu_s_per_1000'], 3)} |"
    )
    for r in result["rows"]:
        lines.append(
            f"| {r['server']} | {r['concurrency']} | {_fmt(r['rps'])} | {_fmt(r['p50_ms'], 2)} | "
            f"{_fmt(r['p99_ms'], 2)} | {r['errors']} | {_fmt(r['cpu_s_per_1000'], 3)} "
            f"({_fmt(r['cpu_root_s_per_1000'], 3)} / {_fmt(r['cpu_descendants_s_per_1000'], 3)}) |"
        )
    return "\n".join(lines)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _text(result: dict[str, Any]) -> str:
    """The run's set-up line, then per model its table and verdicts."""
    tools, load = result["versions"], [result["loadavg_before"][0], result["loadavg_after"][0]]
    lines = [
        f"serving: {result['load_generator']}, loopback, single-row dataframe_split, {WARMUP_S} s warm-up + "
        f"{result['seconds_per_point']} s per point; python {result['python']}, mlflow {tools['mlflow']}, "
        f"sklearn {tools['sklearn']}, {result['cpus']} cpus (load generator on the same cores); "
        f"{result['seconds']} s in all; 1-min load average before/after {load[0]}/{load[1]}"
    ]
    for key, res in result["results"].items():
        model = res["model"]
        lines += ["", f"## {key}: {model['label']} (models:/{model['name']}/{model['version']})", "", _table(res), ""]
        v = res["verdict"]
        if "rps_ratio_c32" in v:
            lines.append(
                f"tollfree rps / mlflow-2w rps at c=32: {v['rps_ratio_c32']['value']:.2f} (target >= "
                f"{TARGETS['rps_ratio_c32_min']}): {'PASS' if v['rps_ratio_c32']['pass'] else 'FAIL'}"
            )
            p = v["p99_c32_ms"]
            lines.append(
                f"p99 at c=32: tollfree {p['tollfree']:.1f} ms vs mlflow-2w {p['mlflow_2w']:.1f} ms (target lower): "
                f"{'PASS' if p['pass'] else 'FAIL'}"
            )
        if "p50_c1_minus_inprocess_ms" in v:
            g = v["p50_c1_minus_inprocess_ms"]
            lines.append(
                f"tollfree p50 - in-process p50 at c=1: {g['value']:.2f} ms (target <= "
                f"{TARGETS['p50_over_inprocess_c1_max_ms']} ms): {'PASS' if g['pass'] else 'FAIL'}"
            )
        lines += [f"FAILED {kind}: {why}" for kind, why in res["failures"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)  # clean up (servers, temp folder) on SIGTERM too
    result = run(args.seconds, args.levels, Provenance("benchmarks.serving", argv))
    print(json.dumps(result, indent=2) if args.json else _text(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
