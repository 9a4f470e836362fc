"""What a shadow costs the clients: an endpoint's p99 at c=32 with and without a slow shadow at 100 %.

    python -m benchmarks.shadow [--seconds 10] [--rounds 3] [--json]

One gateway (benchmarks/serving.py's set-up: no warm pool, the light GBDT as endpoint ``bench`` with
max_concurrency 64) and a second served entity on the same endpoint, ``sleeper``: a model that sleeps 500 ms per
call (``Sleeper``) on one replica. Its route carries no traffic; the runs alternate two configs of the same
entities, so the same processes run in both:

  no-shadow   sleeper's route: traffic 0, no shadow
  shadow-100  sleeper's route: traffic 0, shadow_percentage 100 (every request is copied to it after its answer)

A config change between them touches routes only, so no replica restarts. Each round measures both, in that order,
with wrk (closed loop, c=32, the single-row dataframe_split body) for a 2 s warm-up and --seconds timed; the rounds
repeat it, so a drift of the machine shows in both. The shadow can serve 2 calls a second: nearly every copy is
skipped (its queue is full) or waits; what the client pays is the gateway's work for each copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import time
from typing import Any

import httpx
import mlflow.pyfunc
import numpy as np
import pandas as pd

from benchmarks.common import Provenance, log
from benchmarks.serving import FEATURES, register_models
from benchmarks.serving_load import WARMUP_S, wrk
from benchmarks.serving_servers import VENV_BIN, start_tollfree, throwaway_home
from serving.gateway.process import wait_endpoint_ready

SLEEP_S = 0.5
TARGET = 1.05  # the p99 with the shadow over the p99 without, at most


class Sleeper(mlflow.pyfunc.PythonModel):
    """Sleeps ``sleep_s`` per call, then answers 0 per row: a slow shadow that costs no CPU."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        time.sleep(self.sleep_s)
        return np.zeros(len(model_input))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.shadow", description=__doc__)
    parser.add_argument("--seconds", type=int, default=10, help="timed seconds per point (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both configs (default 3)")
    parser.add_argument("--json", action="store_true", help="print the whole result as JSON")
    return parser.parse_args(argv)


def register_sleeper(columns: list[str]) -> dict[str, Any]:
    from mlflow.models import infer_signature

    frame = pd.DataFrame(np.zeros((1, FEATURES)), columns=columns)
    experiment = mlflow.get_experiment_by_name("bench-serving")  # register_models' (its artifacts in the home)
    with mlflow.start_run(experiment_id=experiment.experiment_id):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=Sleeper(SLEEP_S),
            signature=infer_signature(frame, np.zeros(1)),
            pip_requirements=["mlflow"],
            registered_model_name="bench-sleeper",
        )
    return {"name": "bench-sleeper", "version": str(info.registered_model_version)}


def config(light: dict[str, Any], sleeper: dict[str, Any], shadow: int | None) -> dict[str, Any]:
    route: dict[str, Any] = {"served_entity_name": "sleeper", "traffic_percentage": 0}
    if shadow:
        route["shadow_percentage"] = shadow
    return {
        "served_entities": [
            {"name": "light", "entity_name": light["name"], "entity_version": light["version"], "max_concurrency": 64},
            {"name": "sleeper", "entity_name": sleeper["name"], "entity_version": sleeper["version"]},
        ],
        "traffic_config": {"routes": [{"served_entity_name": "light", "traffic_percentage": 100}, route]},
    }


def _apply(url: str, token: str, body: dict[str, Any]) -> None:
    answer = httpx.put(
        f"{url}/api/2.0/serving-endpoints/bench/config", headers={"Authorization": f"Bearer {token}"}, json=body
    )
    if answer.status_code != 200:
        raise RuntimeError(f"config change: {answer.status_code} {answer.text[:300]}")
    wait_endpoint_ready(url, token, "bench", timeout_s=120)


def _gauges(url: str, token: str) -> dict[str, float]:
    """The shadow's answers so far and the sleeper's ready replicas, from the gateway's metrics."""
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=30).text
    out = {"shadow_answers": 0.0, "sleeper_replicas": 0.0}
    for line in text.splitlines():
        if line.startswith("tollfree_shadow_requests_total{"):
            out["shadow_answers"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("tollfree_replicas{") and 'served_entity="sleeper"' in line:
            out["sleeper_replicas"] = float(line.rsplit(" ", 1)[1])
    return out


def run(seconds: int, rounds: int, provenance: Provenance) -> dict[str, Any]:
    home = throwaway_home("tollfree-bench-shadow-")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    try:
        setup = register_models(home, os.environ["MLFLOW_TRACKING_URI"])
        light = setup["models"]["light"]
        sleeper = register_sleeper(setup["columns"])
        server = start_tollfree(light, env, home / "logs")
        token = server.headers["Authorization"].removeprefix("Bearer ")
        rows = []
        try:
            _apply(server.url, token, config(light, sleeper, None))
            for r in range(rounds):
                for name, shadow in (("no-shadow", None), ("shadow-100", 100)):
                    _apply(server.url, token, config(light, sleeper, shadow))
                    wrk(server, setup["body"], 32, WARMUP_S, home / "post.lua")
                    before = _gauges(server.url, token)
                    result = wrk(server, setup["body"], 32, seconds, home / "post.lua")
                    after = _gauges(server.url, token)
                    duration_s = result["duration_us"] / 1e6
                    row = {
                        "round": r + 1,
                        "config": name,
                        "rps": result["requests"] / duration_s,
                        "p50_ms": result["p50_us"] / 1000,
                        "p99_ms": result["p99_us"] / 1000,
                        "errors": result["non2xx"] + result["connect"] + result["read"] + result["timeout"],
                        "shadow_answers": after["shadow_answers"] - before["shadow_answers"],
                        "sleeper_replicas": [before["sleeper_replicas"], after["sleeper_replicas"]],
                    }
                    rows.append(row)
                    log(
                        f"  round {r + 1} {name:10s} {row['rps']:8.1f} rps  p50 {row['p50_ms']:6.2f} ms  "
                        f"p99 {row['p99_ms']:6.2f} ms  errors {row['errors']}  "
                        f"shadow answers {row['shadow_answers']:.0f}  sleeper replicas {row['sleeper_replicas']}"
                    )
        finally:
            server.stop()
        p99 = {c: statistics.median(r["p99_ms"] for r in rows if r["config"] == c) for c in ("no-shadow", "shadow-100")}
        ratio = p99["shadow-100"] / p99["no-shadow"]
        return {
            **provenance.record(),
            "benchmark": "shadow",
            "seconds_per_point": seconds,
            "warmup_s": WARMUP_S,
            "rows": rows,
            "median_p99_ms": p99,
            "verdict": {
                "value": ratio,
                "target": f"<= {TARGET}",
                "pass": ratio <= TARGET and all(r["errors"] == 0 for r in rows),
            },
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    result = run(args.seconds, args.rounds, Provenance("benchmarks.shadow", argv))
    v = result["verdict"]
    summary = f"p99 with a 500 ms shadow at 100 % over p99 without: {v['value']:.3f} (target {v['target']})"
    print(json.dumps(result, indent=2) if args.json else summary + (": PASS" if v["pass"] else ": FAIL"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
