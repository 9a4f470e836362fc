"""The Open Inference Protocol over gRPC against the MLflow route and the v2 REST route, on one gateway:

    python -m benchmarks.serving_grpc [--seconds 10] [--concurrency 1,8,32] [--json]

The models, the row and the gateway are benchmarks/serving.py's (the light and heavy GBDT, one endpoint ``bench``
with one replica, max_concurrency 64, no warm pool); the gateway also serves gRPC (``--grpc-port``). One load
generator for all three routes, so its cost is the same on each: h2load (nghttp2, Debian's package), closed loop,
one request in flight per connection, ``c`` connections, 2 threads:

  mlflow-route   POST /serving-endpoints/bench/invocations over HTTP/1.1 (h2load --h1), the dataframe_split body
  oip-rest       POST /v2/models/bench/infer over HTTP/1.1, one FP64 input [1, 20] as JSON
  oip-grpc       ModelInfer over HTTP/2 (gRPC framing), the same input as raw_input_contents, the token in the
                 authorization metadata

and, once, the floor of the gRPC server itself:

  grpc-floor     the same ModelInfer request to grpcio's asyncio server in a process of its own, with a handler
                 that answers an empty response at once (no model, no gateway): what grpcio's server costs per call

For each concurrency a 2 s warm-up, then --seconds timed. h2load sees gRPC's HTTP status only (200 even for an
error, whose status is in the trailers), so a point's errors are the gateway's own count of answers that were not
200 over the timed window (``tollfree_requests_total``), for every route alike. p50 and p99 from h2load's
per-request log. CPU: the gateway's and its replica's, from /proc, per 1000 answers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Provenance, log
from benchmarks.serving import register_models
from benchmarks.serving_load import WARMUP_S, cpu_delta, tree_cpu
from benchmarks.serving_servers import VENV_BIN, start_tollfree, throwaway_home

ROUTES = ("mlflow-route", "oip-rest", "oip-grpc")
TARGETS = {"grpc_rps_ratio_c32_min": 1.0, "rest_rps_ratio_c32_min": 0.9}
GRPC_PATH = "/inference.GRPCInferenceService/ModelInfer"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving_grpc", description=__doc__)
    parser.add_argument("--seconds", type=int, default=10, help="timed seconds per point (default 10)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated levels (default 1,8,32)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    args = parser.parse_args(argv)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    return args


def grpc_body(row: list[float]) -> bytes:
    """A ModelInfer request of ``row`` as one FP64 [1, k] raw input, framed as gRPC sends it on the wire."""
    from serving.protocol.v2 import grpc_predict_v2_pb2 as pb

    request = pb.ModelInferRequest(model_name="bench")
    request.inputs.add(name="input-0", datatype="FP64", shape=[1, len(row)])
    request.raw_input_contents.append(np.asarray(row, dtype="<f8").tobytes())
    message = request.SerializeToString()
    return b"\x00" + struct.pack(">I", len(message)) + message


def h2load(route: str, target: dict[str, Any], concurrency: int, seconds: int, work: Path) -> dict[str, Any]:
    """One closed-loop h2load run on ``route``: requests, rps, p50 and p99 from its per-request log."""
    log_file = work / "h2load.log"
    log_file.unlink(missing_ok=True)
    headers = ["-H", f"authorization: {target['token']}"]
    if route == "oip-grpc":
        cmd = ["h2load", *headers, "-H", "content-type: application/grpc", "-H", "te: trailers"]
        cmd += ["-d", str(target["bodies"][route]), f"http://{target['grpc']}{GRPC_PATH}"]
    else:
        path = "/v2/models/bench/infer" if route == "oip-rest" else "/serving-endpoints/bench/invocations"
        cmd = ["h2load", "--h1", *headers, "-H", "content-type: application/json"]
        cmd += ["-d", str(target["bodies"][route]), target["url"] + path]
    cmd += ["-D", str(seconds), "-c", str(concurrency), "-m", "1", "-t", str(min(2, concurrency))]
    done = subprocess.run([*cmd, "--log-file", str(log_file)], capture_output=True, text=True, timeout=seconds + 60)
    durations = []
    statuses = 0
    for line in log_file.read_text().splitlines() if log_file.exists() else []:
        parts = line.split("\t")
        if len(parts) >= 3:
            durations.append(int(parts[2]))
            statuses += parts[1] != "200"
    if not durations:
        raise RuntimeError(f"h2load gave no result (code {done.returncode}): {done.stdout[-500:]} {done.stderr[-300:]}")
    p50, p99 = np.percentile(durations, [50, 99]) / 1000
    return {
        "requests": len(durations),
        "rps": len(durations) / seconds,
        "p50_ms": p50,
        "p99_ms": p99,
        "non200": statuses,
    }


FLOOR_CODE = """
import asyncio, sys
import grpc
from serving.protocol.v2 import grpc_predict_v2_pb2 as pb, grpc_predict_v2_pb2_grpc as pb_grpc

class Floor(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        return pb.ModelInferResponse(model_name=request.model_name)

async def main():
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
    server.add_insecure_port(sys.argv[1])
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()

asyncio.run(main())
"""


def floor(levels: list[int], seconds: int, bodies: dict[str, Path], work: Path) -> list[dict[str, Any]]:
    """grpcio's asyncio server with a handler that does nothing, loaded as the gateway's gRPC route is."""
    import sys

    from serving.replicas.local import free_port
    from serving.settings import PROJECT_DIR

    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-c", FLOOR_CODE, address], stdout=subprocess.PIPE, cwd=PROJECT_DIR, text=True
    )
    try:
        if process.stdout is None or process.stdout.readline().strip() != "ready":
            raise RuntimeError("the gRPC floor server did not start")
        target = {"grpc": address, "token": "none", "bodies": {"oip-grpc": bodies["oip-grpc"]}}
        rows = []
        for c in levels:
            h2load("oip-grpc", target, c, WARMUP_S, work)
            before = tree_cpu(process.pid)
            result = h2load("oip-grpc", target, c, seconds, work)
            cpu = cpu_delta(process.pid, before, tree_cpu(process.pid))
            rows.append(
                {
                    "route": "grpc-floor",
                    "concurrency": c,
                    "rps": result["rps"],
                    "p50_ms": result["p50_ms"],
                    "p99_ms": result["p99_ms"],
                    "requests": result["requests"],
                    "errors": result["non200"],
                    "cpu_s_per_1000": cpu["total_s"] / result["requests"] * 1000,
                }
            )
            log(f"  grpc-floor   c={c:<3d} {result['rps']:8.1f} rps  p50 {result['p50_ms']:6.2f} ms")
        return rows
    finally:
        process.terminate()
        process.wait(timeout=30)


def _answers(target: dict[str, Any]) -> dict[str, float]:
    """The gateway's count of answers by status, over every route."""
    import httpx

    text = httpx.get(target["url"] + "/metrics", headers={"Authorization": target["token"]}, timeout=30).text
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tollfree_requests_total{") and 'endpoint="bench"' in line:
            status = line.split('status="')[1].split('"')[0]
            counts[status] = counts.get(status, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts


def measure(target: dict[str, Any], levels: list[int], seconds: int, work: Path) -> list[dict[str, Any]]:
    rows = []
    for c in levels:
        for route in ROUTES:
            h2load(route, target, c, WARMUP_S, work)
            before, answers = tree_cpu(target["pid"]), _answers(target)
            result = h2load(route, target, c, seconds, work)
            cpu, after = cpu_delta(target["pid"], before, tree_cpu(target["pid"])), _answers(target)
            ok = after.get("200", 0) - answers.get("200", 0)
            refused = sum(after.values()) - sum(answers.values()) - ok
            row = {
                "route": route,
                "concurrency": c,
                "rps": result["rps"],
                "p50_ms": result["p50_ms"],
                "p99_ms": result["p99_ms"],
                "requests": result["requests"],
                "errors": int(refused + result["non200"]),
                "cpu_s_per_1000": cpu["total_s"] / ok * 1000 if ok else None,
            }
            rows.append(row)
            log(
                f"  {route:12s} c={c:<3d} {row['rps']:8.1f} rps  p50 {row['p50_ms']:6.2f} ms  p99 "
                f"{row['p99_ms']:6.2f} ms  errors {row['errors']}  cpu/1000 {row['cpu_s_per_1000'] or math.nan:.3f} s"
            )
    return rows


def verdict(rows: list[dict[str, Any]]) -> dict[str, Any]:
    at = {(r["route"], r["concurrency"]): r for r in rows}
    base = at.get(("mlflow-route", 32))
    out: dict[str, Any] = {}
    for route, key, target in (
        ("oip-grpc", "grpc_rps_ratio_c32", TARGETS["grpc_rps_ratio_c32_min"]),
        ("oip-rest", "rest_rps_ratio_c32", TARGETS["rest_rps_ratio_c32_min"]),
    ):
        row = at.get((route, 32))
        if base and row:
            ratio = row["rps"] / base["rps"]
            out[key] = {
                "value": ratio,
                "target": f">= {target} ({route} / mlflow-route)",
                "pass": ratio >= target and row["errors"] == 0,
            }
    return out


def run(seconds: int, levels: list[int], provenance: Provenance) -> dict[str, Any]:
    from infra.packages import ensure_binary
    from serving.replicas.local import free_port

    ensure_binary("h2load", "nghttp2-client")
    home = throwaway_home("tollfree-bench-grpc-")
    work = Path(tempfile.mkdtemp(prefix="tollfree-bench-grpc-work-"))
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        setup = register_models(home, os.environ["MLFLOW_TRACKING_URI"])
        bodies = {"mlflow-route": work / "mlflow.json", "oip-rest": work / "oip.json", "oip-grpc": work / "grpc.bin"}
        bodies["mlflow-route"].write_text(setup["body"])
        bodies["oip-rest"].write_text(setup["oip_body"])
        bodies["oip-grpc"].write_bytes(grpc_body(setup["row"]))
        results: dict[str, Any] = {"floor": {"rows": floor(levels, seconds, bodies, work)}}
        for key, model in setup["models"].items():
            log(f"model {key}: {model['label']}")
            grpc_port = free_port()
            server = start_tollfree(model, {**env, "TOLLFREE_GRPC_PORT": str(grpc_port)}, home / "logs")
            target = {
                "url": server.url,
                "grpc": f"127.0.0.1:{grpc_port}",
                "token": server.headers["Authorization"],
                "pid": server.pid,
                "bodies": bodies,
            }
            try:
                rows = measure(target, levels, seconds, work)
            finally:
                server.stop()
            results[key] = {"model": model, "rows": rows, "verdict": verdict(rows)}
        version = subprocess.run(["h2load", "--version"], capture_output=True, text=True).stdout.strip()
        return {
            **provenance.record(),
            "benchmark": "serving_grpc",
            "load_generator": version,
            "seconds_per_point": seconds,
            "warmup_s": WARMUP_S,
            "concurrency": levels,
            "results": results,
            "targets": TARGETS,
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _text(result: dict[str, Any]) -> str:
    lines = [f"serving_grpc: {result['load_generator']}, {result['seconds_per_point']} s per point"]
    for key, res in result["results"].items():
        label = res["model"]["label"] if "model" in res else "grpcio's server alone, no model"
        lines += ["", f"## {key}: {label}", "", "| route | c | rps | p50 ms | p99 ms | errors |"]
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: |")
        for r in res["rows"]:
            lines.append(
                f"| {r['route']} | {r['concurrency']} | {r['rps']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | "
                f"{r['errors']} |"
            )
        for name, v in res.get("verdict", {}).items():
            lines.append(f"{name}: {v['value']:.2f} (target {v['target']}): {'PASS' if v['pass'] else 'FAIL'}")
    return "\n".join(lines)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    started = time.monotonic()
    result = run(args.seconds, args.levels, Provenance("benchmarks.serving_grpc", argv))
    print(json.dumps(result, indent=2) if args.json else _text(result))
    log(f"done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
