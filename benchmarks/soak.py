"""Soak: an endpoint at 70 % of its capacity for 10 minutes with the autoscaler on; no errors, memory flat.

    python -m benchmarks.soak [--minutes 10] [--load 0.7] [--home DIR] [--json]

In a throw-away TOLLFREE_HOME (or ``--home``, which must hold ``fraud@champion``, e.g. after
``make demo``) the real flows build the synthetic world and train the fraud model; a gateway
(``python -m serving``, autoscaler and warm pool on) serves it on loopback. Capacity is measured
first on the endpoint pinned at one replica (closed loop, 8 clients, 10 s); the endpoint is then
reconfigured to autoscale (1 to 2 replicas) and loaded open loop at ``--load`` x capacity for
``--minutes``. Printed per minute: answers by status, p50/p99, gateway + replica RSS, replicas, the vertical
axis's per-replica target and the busy share its last cycle measured.
Pass/fail: no answer other than 200; RSS growth from the end of minute 1 to the end under 10 %, for
the gateway process and for the mean model replica (per process, so a replica the autoscaler adds is
not read as growth).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.common import Provenance, build_fraud_world, fraud_body
from benchmarks.load import LoadResult, run_load

ROWS = 20
NAME = "soak"


def _rss_mb(pid: int) -> tuple[float, float]:
    """(the gateway's RSS, the mean RSS of its model replicas) in MB: per process, so that the autoscaler
    adding a replica is not read as growth."""
    root = psutil.Process(pid)
    replicas = []
    for child in root.children(recursive=True):
        try:
            if "--model-uri" in child.cmdline():
                replicas.append(child.memory_info().rss)
        except psutil.NoSuchProcess:
            continue
    mean = sum(replicas) / len(replicas) if replicas else 0.0
    return root.memory_info().rss / 2**20, mean / 2**20


def _minute_row(part: LoadResult, gateway: Any, headers: dict[str, str]) -> dict[str, Any]:
    """One minute's line: answers by status, latency, RSS, replicas, and the vertical axis (its per-replica
    target now, and the busy share its last cycle measured)."""
    replicas = httpx.get(f"{gateway.url}/metrics", headers=headers, timeout=30).text
    gateway_mb, replica_mb = _rss_mb(gateway.process.pid)
    count = sum(
        float(line.rsplit(" ", 1)[1])
        for line in replicas.splitlines()
        if line.startswith("tollfree_replicas{") and f'endpoint="{NAME}"' in line
    )
    target = next(
        (
            float(line.rsplit(" ", 1)[1])
            for line in replicas.splitlines()
            if line.startswith("tollfree_autoscaler_target_concurrency{") and f'endpoint="{NAME}"' in line
        ),
        None,
    )
    trail = httpx.get(
        f"{gateway.url}/api/2.0/serving-endpoints/{NAME}/autoscaler", params={"limit": 120}, headers=headers, timeout=30
    ).json()["decisions"]
    cycles = [d["inputs"] for d in trail if d["inputs"].get("vertical")]
    busy = cycles[-1].get("utilisation") if cycles else None
    return {
        "statuses": part.statuses(),
        "rps": round(part.rate(), 1),
        "p50_ms": round(part.percentile(50) * 1000, 1),
        "p99_ms": round(part.percentile(99) * 1000, 1),
        "gateway_rss_mb": round(gateway_mb),
        "replica_rss_mb": round(replica_mb),
        "replicas": count,
        "target": None if target is None else round(target, 2),
        "busy": None if busy is None else round(busy, 3),
        "not_sent": part.skipped,
    }


def _report(total: LoadResult, minutes: list[dict[str, Any]], capacity: float, rate: float) -> dict[str, Any]:
    """The whole run and its verdict: no answer other than 200, RSS growth under 10 %."""
    errors = {k: v for k, v in total.statuses().items() if k != "200"}
    growth = max((minutes[-1][k] - minutes[0][k]) / minutes[0][k] for k in ("gateway_rss_mb", "replica_rss_mb"))
    return {
        "capacity_rps": round(capacity, 1),
        "offered_rps": round(rate, 1),
        "minutes": len(minutes),
        "requests": len(total.outcomes),
        "errors": errors,
        "p50_ms": round(total.percentile(50) * 1000, 1),
        "p99_ms": round(total.percentile(99) * 1000, 1),
        "gateway_rss_mb": [minutes[0]["gateway_rss_mb"], minutes[-1]["gateway_rss_mb"]],
        "replica_rss_mb": [minutes[0]["replica_rss_mb"], minutes[-1]["replica_rss_mb"]],
        "rss_growth": round(growth, 4),
        "not_sent": total.skipped,
        "passed": not errors and growth < 0.10,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=0.7, help="fraction of the measured capacity")
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    provenance = Provenance("benchmarks.soak", argv)
    own_home = args.home is None
    home = Path(tempfile.mkdtemp(prefix="tollfree-soak-")) if own_home else args.home.resolve()
    os.environ["TOLLFREE_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("TOLLFREE_TOKEN", "soak-" + secrets.token_hex(16))
    from serving.settings import export_defaults

    export_defaults(os.environ)
    if own_home:
        print(f"building the world in {home} ...", flush=True)
        build_fraud_world(home)
    from serving.gateway.process import start_gateway, wait_endpoint_ready

    token = os.environ["TOLLFREE_TOKEN"]
    headers = {"Authorization": f"Bearer {token}"}
    gateway = start_gateway(dict(os.environ), home / "logs" / "gateway-soak.log")
    report: dict[str, Any] = {}
    try:
        base = {"entity_name": "fraud", "entity_alias": "champion"}
        reply = httpx.post(
            f"{gateway.url}/api/2.0/serving-endpoints",
            headers=headers,
            timeout=120,
            json={"name": NAME, "config": {"served_entities": [{**base, "min_replicas": 1, "max_replicas": 1}]}},
        )
        reply.raise_for_status()
        wait_endpoint_ready(gateway.url, token, NAME, timeout_s=300)
        url = f"{gateway.url}/serving-endpoints/{NAME}/invocations"
        body = fraud_body(home, ROWS)
        asyncio.run(run_load(url, token, body, 3.0, concurrency=4))
        calibration = asyncio.run(run_load(url, token, body, 10.0, concurrency=8))
        capacity = calibration.rate()
        print(f"capacity at 1 replica: {capacity:.0f} req/s ({ROWS} rows each) [{calibration.summary()}]", flush=True)
        reply = httpx.put(
            f"{gateway.url}/api/2.0/serving-endpoints/{NAME}/config",
            headers=headers,
            timeout=120,
            json={"served_entities": [{**base, "min_replicas": 1, "max_replicas": 2}]},
        )
        reply.raise_for_status()
        wait_endpoint_ready(gateway.url, token, NAME, timeout_s=300)
        rate = args.load * capacity
        minutes: list[dict[str, Any]] = []
        total = LoadResult()
        for minute in range(max(1, round(args.minutes))):
            span = 60.0 if args.minutes >= 1 else args.minutes * 60
            part = asyncio.run(run_load(url, token, body, span, rate=rate, max_outstanding=500))
            total.outcomes.extend(part.outcomes)
            total.duration_s += part.duration_s
            total.skipped += part.skipped
            row = {"minute": minute + 1, **_minute_row(part, gateway, headers)}
            minutes.append(row)
            print(json.dumps(row), flush=True)
        report = {**provenance.record(), **_report(total, minutes, capacity, rate)}
    finally:
        gateway.stop(grace_s=60)
        if own_home and not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
            shutil.rmtree(home, ignore_errors=True)
    print(
        json.dumps(report)
        if args.json
        else f"soak: {report['requests']} requests at {report['offered_rps']} req/s "
        f"({args.load:.0%} of {report['capacity_rps']}) for {report['minutes']} min; "
        f"errors {report['errors'] or 'none'}; "
        f"p50 {report['p50_ms']} ms, p99 {report['p99_ms']} ms; RSS gateway {report['gateway_rss_mb']} MB, per replica "
        f"{report['replica_rss_mb']} MB (end of minute 1 -> end; worst growth {report['rss_growth']:+.1%}); "
        f"{'PASS' if report['passed'] else 'FAIL'}"
    )
    return 0 if report.get("passed") else 1


if __name__ == "__main__":
    sys.exit(main())
