"""What the shared state costs per request: one gateway against two gateways on one PostgreSQL store.

    python -m benchmarks.gateways [--seconds 10] [--concurrency 32] [--json]

The light model of benchmarks/serving.py (GBDT 100 trees, depth 3, 20 features; single-row
``dataframe_split``), endpoint ``bench`` with ``max_concurrency`` 64, no warm pool, every other setting
the shipped default (autoscaler on). Three set-ups, one after another, each on a fresh store:

  one-sqlite    one gateway on the embedded SQLite store (the default)
  one-postgres  one gateway on PostgreSQL (it holds the leader lease; no follower)
  two-postgres  two gateways on one PostgreSQL: the leader runs the replica, the follower routes to it;
                the load is split, half the connections to each (as a load balancer would)

Load: wrk, closed loop, keep-alive, 2 s warm-up then --seconds timed; for two gateways two wrk processes
at once, their requests summed. Everything (PostgreSQL, gateways, replica, wrk) shares this machine's
cores. After each run, the replicas the registry lists for the endpoint are reported (the autoscaler may
add some; then the set-ups differ in more than the store).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Provenance, log
from benchmarks.serving import register_models
from benchmarks.serving_load import WARMUP_S, check_one, wrk
from benchmarks.serving_servers import READY_TIMEOUT_S, Server, create_bench_endpoint, throwaway_home

TARGET_TWO_OVER_ONE = 0.9


def _gateways(model: dict[str, Any], env: dict[str, str], logs: Path, n: int, tag: str) -> list[Any]:
    """``n`` gateways on ``env``'s store, the endpoint created through the first and served by all."""
    from serving.gateway.process import start_gateway

    started = [start_gateway(env, logs / f"gateway-{tag}-{i}.log", timeout_s=READY_TIMEOUT_S) for i in range(n)]
    create_bench_endpoint(started[0].url, env["TOLLFREE_TOKEN"], model, {"max_concurrency": 64})
    return started


def _replicas(state_url: str) -> int:
    from serving.state.database import open_database
    from serving.state.replica_table import ReplicaTable

    database = open_database(state_url)
    try:
        return sum(1 for r in ReplicaTable(database).all() if r.endpoint == "bench")
    finally:
        database.engine.dispose()


def _load(servers: list[Server], body: str, concurrency: int, seconds: int, home: Path) -> dict[str, Any]:
    """wrk against every server at once, the connections split evenly; requests summed."""
    share = max(1, concurrency // len(servers))
    results: list[dict[str, Any]] = [{} for _ in servers]

    def one(i: int, duration: int) -> None:
        results[i] = wrk(servers[i], body, share, duration, home / f"post-{i}.lua")

    for duration in (WARMUP_S, seconds):
        threads = [threading.Thread(target=one, args=(i, duration)) for i in range(len(servers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 60)
    requests = sum(r["requests"] for r in results)
    errors = sum(r["non2xx"] + r["connect"] + r["read"] + r["write"] + r["timeout"] for r in results)
    duration_s = max(r["duration_us"] for r in results) / 1e6
    return {
        "rps": requests / duration_s,
        "requests": requests,
        "errors": errors,
        "p50_ms": [r["p50_us"] / 1000 for r in results],
        "p99_ms": [r["p99_us"] / 1000 for r in results],
    }


def run(seconds: int, concurrency: int, provenance: Provenance) -> dict[str, Any]:
    """The three set-ups in turn, each on a fresh store; the two-over-one ratio and its verdict; the run's record."""
    from tests.services import postgres_server

    home = throwaway_home("tollfree-bench-gateways-")
    rows = []
    try:
        setup = register_models(home, os.environ["MLFLOW_TRACKING_URI"])
        model, body = setup["models"]["light"], setup["body"]
        with postgres_server() as pg:
            for tag, n in (("one-sqlite", 1), ("one-postgres", 1), ("two-postgres", 2)):
                state = f"sqlite:///{home / (tag + '.db')}" if tag.endswith("sqlite") else pg.url(pg.new_database())
                rows.append(_one_setup(tag, n, state, model, body, concurrency, seconds, home))
        one = next(r for r in rows if r["setup"] == "one-sqlite")["rps"]
        two = next(r for r in rows if r["setup"] == "two-postgres")["rps"]
        return {
            **provenance.record(),
            "benchmark": "gateways",
            "seconds_per_point": seconds,
            "warmup_s": WARMUP_S,
            "rows": rows,
            "two_over_one": two / one,
            "target": f">= {TARGET_TWO_OVER_ONE}",
            "pass": two / one >= TARGET_TWO_OVER_ONE,
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _one_setup(
    tag: str, n: int, state: str, model: dict[str, Any], body: str, concurrency: int, seconds: int, home: Path
) -> dict[str, Any]:
    """``n`` gateways on the store at ``state`` serving ``model``, loaded together; their row of the table."""
    env = {
        **os.environ,
        "TOLLFREE_TOKEN": secrets.token_urlsafe(24),
        "TOLLFREE_WARM_POOL": "0",
        "TOLLFREE_STATE_URL": state,
        "TOLLFREE_REPLICA_TOKEN": secrets.token_urlsafe(24),
    }
    logs = home / "logs"
    gateways = _gateways(model, env, logs, n, tag)
    try:
        auth = {"Authorization": f"Bearer {env['TOLLFREE_TOKEN']}"}
        servers = [
            Server(tag, g.url, "/serving-endpoints/bench/invocations", auth, g.process.pid, None) for g in gateways
        ]
        for server in servers:
            _until_routing(server, body)
        row = {
            "setup": tag,
            "gateways": n,
            "concurrency": concurrency,
            **_load(servers, body, concurrency, seconds, home),
            "replicas_after": _replicas(state),
        }
        log(
            f"{tag:13s} {row['rps']:8.1f} rps  errors {row['errors']}  p50 {row['p50_ms']} ms  "
            f"replicas {row['replicas_after']}"
        )
        return row
    finally:
        for g in reversed(gateways):
            g.stop()
        for pid in _stray_replicas(logs):
            os.killpg(pid, signal.SIGKILL)


def _until_routing(server: Server, body: str, timeout_s: float = 30.0) -> None:
    """Waits until ``server`` answers ``body``: a follower routes once it has read the registry."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            check_one(server, body)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _stray_replicas(logs: Path) -> list[int]:
    """Replicas left by a gateway of several (it leaves them to the next leader): none comes here."""
    from serving.replicas.local import is_replica_process

    found = []
    for status in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = status.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serving.replica_server" in args and b"--port" in args:
            pid, port = int(status.parent.name), int(args[args.index(b"--port") + 1])
            if is_replica_process(pid, port) and (logs / f"replica-{port}.log").exists():
                found.append(pid)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateways", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= 120 or not 2 <= args.concurrency <= 256:
        parser.error("--seconds must be in 1..120 and --concurrency in 2..256")
    result = run(args.seconds, args.concurrency, Provenance("benchmarks.gateways", argv))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print("| setup | gateways | c | rps | p50 ms (per gateway) | p99 ms (per gateway) | errors | replicas after |")
    print("| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |")
    for r in result["rows"]:
        print(
            f"| {r['setup']} | {r['gateways']} | {r['concurrency']} | {r['rps']:.1f} | "
            f"{', '.join(f'{v:.2f}' for v in r['p50_ms'])} | {', '.join(f'{v:.2f}' for v in r['p99_ms'])} | "
            f"{r['errors']} | {r['replicas_after']} |"
        )
    print(
        f"\ntwo gateways / one gateway at c={args.concurrency}: {result['two_over_one']:.2f} "
        f"(target {result['target']}): {'PASS' if result['pass'] else 'FAIL'}; load average before/after "
        f"{result['loadavg_before'][0]}/{result['loadavg_after'][0]}; {result['seconds']} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
