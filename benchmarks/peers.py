"""tollfree side by side with the servers users would pick instead, one run, one table.

    python -m benchmarks.peers [--seconds 10] [--levels 1,8,32,128] [--rows 1,32]
                               [--models light,heavy,pipeline] [--servers tollfree,...] [--repeat 1] [--json]

Models (fitted once per run, the same object for every server):

  light     GradientBoostingClassifier(100 trees, depth 3) on 20 float columns
  heavy     GradientBoostingClassifier(500 trees, depth 6) on 20 float columns
  pipeline  StandardScaler on 19 float columns + OneHotEncoder on a string column "cat", then the light GBDT:
            tollfree's float64 fast path does not apply (pandas and MLflow's schema enforcement run)

Servers, one at a time, everything on 127.0.0.1 and the same 2 cores as wrk:

  tollfree          python -m serving, shipped defaults (autoscaler on, both axes); the model logged with a
                    signature and no input example: the replica profiles it on a row built from the signature
                    and batches concurrent requests when the profile says batches pay
  tollfree-example  the same, the model logged with an input example: the replica profiles it on the
                    example's first row
  tollfree-fixed    defaults, but max_concurrency fixed at 64 (the vertical axis off): the autoscaler's cost
  mlflow-2w         mlflow models serve -w 2 --env-manager local, in tollfree's venv (uvloop installed)
  mlserver, mlserver-batch, bentoml, bentoml-batch, rayserve, kserve: see benchmarks/peer_servers.py, each in
                    its own virtualenv (benchmarks/peer_envs.py), 2 workers or replicas, batching as named
  uvicorn           a bare ASGI app returning a constant, 2 workers: the ceiling for a Python HTTP server here

Each server must answer the in-process predictions for the sample rows before it is timed. Load: wrk (closed
loop, keep-alive, min(2, c) threads), each server's native request format, 2 s warm-up then --seconds timed
per point. CPU-s per 1000 predictions: utime+stime of the server's process tree from /proc over the timed
window, per predicted row. The 1-minute load average is recorded before and after each server.

--repeat N: N rounds of every server in turn (a slow spell of the machine falls on all alike); each point is the
median of its rounds, its rps range beside it, and the verdict is taken on the medians.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks import peers_models
from benchmarks.common import Provenance, log
from benchmarks.peers_models import MODELS
from benchmarks.peers_report import CEILING, OURS, TARGETS, attach_decisions, medians, render, scaling_text, verdict
from benchmarks.serving_load import WARMUP_S, cpu_delta, tree_cpu, wrk
from benchmarks.serving_servers import VENV_BIN, Server, start_mlflow, start_tollfree, throwaway_home

TOLLFREE = ("tollfree", "tollfree-example", "tollfree-fixed")
BATCHING = ("mlserver", "bentoml", "rayserve")  # peers with adaptive batching: each also runs with it on (-batch)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    from benchmarks.peer_servers import PEER_KINDS

    every = [
        *TOLLFREE,
        "mlflow-2w",
        *[k for kind in PEER_KINDS for k in ((kind, f"{kind}-batch") if kind in BATCHING else (kind,))],
    ]
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.peers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--levels", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128])
    parser.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    parser.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    parser.add_argument("--servers", type=lambda s: s.split(","), default=every)
    parser.add_argument("--repeat", type=int, default=1, help="rounds; each point is the median of its rounds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    for name in args.models:
        if name not in MODELS:
            parser.error(f"unknown model {name!r}: one of {', '.join(MODELS)}")
    for name in args.servers:
        if name not in every:
            parser.error(f"unknown server {name!r}: one of {', '.join(every)}")
    return args


# --- servers -------------------------------------------------------------------------------------------


def _start(kind: str, model: dict[str, Any], env: dict[str, str], home: Path) -> Server:
    logs = home / "logs"
    if kind == "tollfree":
        return start_tollfree(model["plain"], env, logs, kind=kind, entity={})
    if kind == "tollfree-example":
        return start_tollfree(model["example"], env, logs, kind=kind, entity={})
    if kind == "tollfree-fixed":
        return start_tollfree(model["plain"], env, logs, kind=kind, entity={"max_concurrency": 64})
    if kind == "mlflow-2w":
        return start_mlflow(model["plain"], 2, env, logs)
    from benchmarks import peer_servers
    from benchmarks.peer_envs import ensure_venv

    base, _, variant = kind.partition("-")
    python = ensure_venv(base)
    workdir = home / kind
    workdir.mkdir(exist_ok=True)
    start = getattr(peer_servers, f"start_{base}")
    server = start(python, model["path"], workdir, logs, workers=2, batching=variant == "batch")
    server.kind = kind
    return server


def _path_taken(kind: str, home: Path, since: float) -> str:
    """The float64 fast path and the batch plan, from the newest replica log since ``since`` that names them."""
    if kind not in TOLLFREE:
        return ""
    logs = sorted(
        (p for p in (home / "logs").glob("replica-*.log") if p.stat().st_mtime >= since), key=os.path.getmtime
    )
    text = next((t for t in (p.read_text(errors="replace") for p in reversed(logs)) if "numpy path:" in t), "")
    fast = re.findall(r"numpy path: (yes|no)", text)
    batch = re.findall(r"-> BatchPlan\(([^)]*)\)", text)
    enabled = "batching " + ("on" if batch and "enabled=True" in batch[-1] else "off")
    return f"{'fast path' if fast and fast[-1] == 'yes' else 'pandas path'}, {enabled}"


def _decisions(server: Server) -> list[dict[str, Any]]:
    """tollfree's autoscaler decisions for the benchmark's endpoint, oldest first, with their inputs."""
    import httpx

    answer = httpx.get(f"{server.url}/api/2.0/serving-endpoints/bench/autoscaler", headers=server.headers, timeout=30)
    return answer.json().get("decisions", []) if answer.status_code == 200 else []


def _check(kind: str, server: Server, model: dict[str, Any], n: int) -> None:
    import httpx

    path, body, headers = peers_models.request(kind, model, n)
    answer = httpx.post(
        server.url + (path or server.path),
        content=body,
        timeout=60,
        headers={"content-type": "application/json", **server.headers, **headers},
    )
    if answer.status_code != 200:
        raise RuntimeError(f"{kind}: sample request gave HTTP {answer.status_code}: {answer.text[:300]}")
    if kind != CEILING:
        got = [int(v) for v in peers_models.predictions(kind, answer.json())]
        if got != model["expected"][:n]:
            raise RuntimeError(f"{kind}: predictions differ from the model's own: {got[:8]} vs {model['expected'][:8]}")


def _point(
    kind: str, server: Server, model: dict[str, Any], n: int, c: int, seconds: int, script: Path
) -> dict[str, Any]:
    path, body, headers = peers_models.request(kind, model, n)
    target = Server(kind, server.url, path or server.path, {**server.headers, **headers}, server.pid, None)
    started = time.monotonic()  # the system's monotonic clock: the gateway stamps its decisions with it too
    wrk(target, body, c, WARMUP_S, script)
    before = tree_cpu(server.pid)
    result = wrk(target, body, c, seconds, script)
    cpu = cpu_delta(server.pid, before, tree_cpu(server.pid))
    ok = max(result["requests"] - result["non2xx"], 0)
    duration_s = result["duration_us"] / 1e6
    errors = sum(result[k] for k in ("non2xx", "connect", "read", "write", "timeout"))
    row = {
        "server": kind,
        "rows": n,
        "concurrency": c,
        "rps": result["requests"] / duration_s,
        "rows_per_s": ok * n / duration_s,
        "p50_ms": result["p50_us"] / 1000,
        "p99_ms": result["p99_us"] / 1000,
        "errors": errors,
        "cpu_s_per_1000_predictions": cpu["total_s"] / (ok * n) * 1000 if ok else None,
        "window": [started, time.monotonic()],
    }
    log(
        f"  {kind:16s} rows={n:<2d} c={c:<3d} {row['rps']:8.1f} rps  p50 {row['p50_ms']:7.2f} ms  "
        f"p99 {row['p99_ms']:7.2f} ms  errors {errors}"
    )
    return row


def _serve_and_measure(
    kind: str, model: dict[str, Any], env: dict[str, str], home: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    load_before = os.getloadavg()[0]
    began, wall = time.monotonic(), time.time()
    server = _start(kind, model, env, home)
    info: dict[str, Any] = {"start_s": round(time.monotonic() - began, 1)}
    try:
        for n in args.rows:
            _check(kind, server, model, n)
        info["path"] = _path_taken(kind, home, wall)
        rows = [
            _point(kind, server, model, n, c, args.seconds, home / "post.lua") for n in args.rows for c in args.levels
        ]
        decisions = _decisions(server) if kind in TOLLFREE else []
        attach_decisions(rows, decisions)
        if kind in TOLLFREE:
            info["path"] += scaling_text(decisions)
    finally:
        server.stop()
    info["loadavg_1m_before_after"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return rows, info


# --- run -----------------------------------------------------------------------------------------------


def _rounds(
    model: dict[str, Any], env: dict[str, str], home: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]], dict[str, str]]:
    """Every server once per round (``--repeat``), each row with its round; a server's info: its first round's,
    with every round's path and load average added."""
    rows: list[dict[str, Any]] = []
    info: dict[str, dict[str, Any]] = {}
    failures: dict[str, str] = {}
    for round_no in range(args.repeat):
        for kind in args.servers:
            if args.repeat > 1:
                log(f"round {round_no + 1} of {args.repeat}: {kind}")
            try:
                got, seen = _serve_and_measure(kind, model, env, home, args)
            except Exception as exc:
                failures[kind] = f"{type(exc).__name__}: {str(exc)[:300]}"
                log(f"  {kind}: FAILED: {failures[kind]}")
                continue
            rows += [{**r, "round": round_no} for r in got]
            if kind not in info:
                info[kind] = seen
            elif seen.get("path") != info[kind].get("path"):
                info[kind]["path"] = f"{info[kind].get('path')} / {seen.get('path')}"  # no "|": a table cell
            info[kind].setdefault("loadavg_1m_rounds", []).append(seen["loadavg_1m_before_after"])
    return rows, info, failures


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Per model, every server's rounds, their medians and the verdict; the peers' versions; the run's record."""
    home = throwaway_home("tollfree-bench-peers-")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    provenance = Provenance("benchmarks.peers", " ".join(_argv(args)).split())
    try:
        models = peers_models.prepare(args.models, home)
        results: dict[str, Any] = {}
        versions: dict[str, dict[str, str]] = {}
        for key, model in models.items():
            rows, info, failures = _rounds(model, env, home, args)
            points = medians(rows)
            results[key] = {
                "label": MODELS[key],
                "rows": points,
                "rounds": rows,
                "servers": info,
                "failures": failures,
                "in_process_p50_ms": round(model["in_process_ms"], 3),
                "verdict": verdict(points, model["in_process_ms"]),
            }
        from benchmarks.peer_envs import versions as peer_versions

        for kind in {k.partition("-")[0] for k in args.servers if k not in OURS}:
            with contextlib.suppress(Exception):
                versions[kind] = peer_versions(kind)
        import mlflow
        import sklearn

        return {
            **provenance.record(),
            "benchmark": "peers",
            "seconds_per_point": args.seconds,
            "warmup_s": WARMUP_S,
            "results": results,
            "targets": TARGETS,
            "peer_versions": versions,
            "versions": {
                "mlflow": mlflow.__version__,
                "sklearn": sklearn.__version__,
                "wrk": subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.splitlines()[0],
            },
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--seconds {args.seconds}",
        f"--levels {','.join(map(str, args.levels))}",
        f"--rows {','.join(map(str, args.rows))}",
        f"--models {','.join(args.models)}",
        f"--servers {','.join(args.servers)}",
        *([f"--repeat {args.repeat}"] if args.repeat > 1 else []),
    ]


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    result = run(args)
    print(json.dumps(result, indent=2, default=str) if args.json else render(result, WARMUP_S))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
