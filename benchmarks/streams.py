"""Stream inputs: tollfree's consumer against a naive one, its ceiling, p99 at half of it, a 10x burst.

    python -m benchmarks.streams [--quick] [--workdir DIR] [--replicas 1]

A real redis-server and gateway (``python -m serving``) on 127.0.0.1 serve the world's ``fraud@champion`` as
``fraud-stream``; see docs/benchmarks/streams.md for the phases, the targets and the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import redis

from benchmarks.batch_setup import log
from benchmarks.common import Provenance, percentile
from benchmarks.streams_figures import drain_rate, due, gauge, group_lag, recovery_s
from benchmarks.streams_report import table, verdicts
from benchmarks.streams_stack import ENDPOINT, GROUP, SINK, SOURCE, Gateway, SinkReader, append, events, world
from serving.inference_log import read_inference_log
from serving.streams.broker import entry_ms

NAIVE_SOURCE, NAIVE_SINK = "naive-tx", "naive-scores"


def naive(gw: Gateway, batch: list[dict[str, str]]) -> dict[str, Any]:
    """The naive consumer the target compares with: per event in turn, one XREAD of one entry, one HTTP
    invocation, one XADD."""
    gw.client.delete(NAIVE_SOURCE)  # read from its start: the whole batch is in it before the clock starts
    last, ids, sink = "0-0", append(gw.client, NAIVE_SOURCE, batch), SinkReader(gw.client, NAIVE_SINK)
    url, done = f"{gw.process.url}/serving-endpoints/{ENDPOINT}/invocations", 0
    cpu0, started = gw.cpu(), time.monotonic()
    with httpx.Client(headers={"Authorization": f"Bearer {gw.token}"}, timeout=30) as http:
        while done < len(ids):
            entry_id, fields = gw.client.xread({NAIVE_SOURCE: last}, count=1)[0][1][0]  # type: ignore[index]  # redis-py types xread's reply as a bare Awaitable | Any
            last, done = entry_id.decode(), done + 1
            row = {"customer_id": int(fields[b"customer_id"]), "merchant_id": int(fields[b"merchant_id"])}
            answer = http.post(url, json={"dataframe_records": [{**row, "amount": float(fields[b"amount"])}]})
            if answer.status_code == 200:
                gw.client.xadd(
                    NAIVE_SINK,
                    {
                        "event_id": last,
                        "prediction": json.dumps(answer.json()["predictions"][0]),
                        "served_entity": answer.headers.get("served-model-name", ""),
                    },
                )
    wall, complete = time.monotonic() - started, sink.wait(ids, timeout_s=10)
    results = [s for i in ids for s in sink.seen.get(i, [])]
    return {
        "events": len(ids),
        "results": len(results),
        "complete": complete,
        "wall_s": round(wall, 2),
        "events_per_s": round(drain_rate(results), 1),
        "cpu_cores": gw.cores(cpu0, wall),
    }


def ceiling(gw: Gateway, batch: list[dict[str, str]]) -> dict[str, Any]:
    """``batch`` appended at once; results per second from the first result to the last (the sink's ids)."""
    sink, cpu0, started = SinkReader(gw.client, SINK), gw.cpu(), time.monotonic()
    ids = append(gw.client, SOURCE, batch)
    appended_s, complete = time.monotonic() - started, sink.wait(ids, timeout_s=max(600.0, len(batch) / 50))
    wall, results = time.monotonic() - started, [s for i in ids for s in sink.seen.get(i, [])]
    ms = sorted(entry_ms(s) for s in results)
    return {
        "events": len(ids),
        "results": len(results),
        "complete": complete,
        "append_s": round(appended_s, 2),
        "drain_s": round((ms[-1] - ms[0]) / 1000, 2) if ms else None,
        "events_per_s": round(drain_rate(results), 1),
        "cpu_cores": gw.cores(cpu0, wall),
    }


@contextlib.contextmanager
def load(gw: Gateway, pool: list[dict[str, str]], rate: float) -> Iterator[SimpleNamespace]:
    """A paced producer (``rate`` events a second: every 5 ms, those ``due`` by then, in one pipeline) and a sampler
    (every second: the group's lag from XINFO GROUPS, the endpoint's ready and desired replicas from /metrics)."""
    state, halt = SimpleNamespace(ids=[], lag=[], replicas=[]), threading.Event()

    def produce(client: Any) -> None:
        started = time.perf_counter()
        while not halt.wait(0.005):
            at, n = len(state.ids), due(rate, time.perf_counter() - started) - len(state.ids)
            if n > 0:
                state.ids.extend(append(client, SOURCE, [pool[(at + k) % len(pool)] for k in range(n)]))

    def sample(client: Any) -> None:
        while not halt.wait(1 - time.monotonic() % 1):
            now, text = time.monotonic(), gw.api.get("/metrics").text
            state.lag.append((now, group_lag(client.xinfo_groups(SOURCE), GROUP)))
            state.replicas.append(
                (
                    now,
                    (
                        gauge(text, "tollfree_replicas", ENDPOINT),
                        gauge(text, "tollfree_autoscaler_desired_replicas", ENDPOINT),
                    ),
                )
            )

    threads = [
        threading.Thread(target=f, args=(redis.Redis(port=gw.redis.port),), daemon=True) for f in (produce, sample)
    ]
    for thread in threads:
        thread.start()
    try:
        yield state
    finally:
        halt.set()
        for thread in threads:
            thread.join()


def breakdown(gw: Gateway, sink: SinkReader, ids: list[str]) -> dict[str, list[float]]:
    """p50, p99 ms of each event's wait (appended -> scoring), scoring (inference log's latency_ms), write (-> sink)."""
    time.sleep(3.0)  # the inference log is flushed every second
    frame = read_inference_log(gw.home / "inference_log", endpoint=ENDPOINT).query("request_id in @ids")
    scored = frame["timestamp"].map(lambda t: t.timestamp() * 1000)  # the gateway's clock: Redis' too (one machine)
    parts = {
        "wait": scored - frame["latency_ms"] - frame["request_id"].map(entry_ms),
        "scoring": frame["latency_ms"],
        "write": frame["request_id"].map(lambda i: entry_ms(sink.seen[i][0])) - scored,
    }
    return {k: [round(percentile(v, 50), 1), round(percentile(v, 99), 1)] for k, v in parts.items()}


def steady(gw: Gateway, pool: list[dict[str, str]], rate: float, warm_s: float, seconds: float) -> dict[str, Any]:
    """A paced producer at ``rate``; after ``warm_s``, ``seconds`` measured: append-to-result latency, the lag."""
    sink = SinkReader(gw.client, SINK)
    with load(gw, pool, rate) as state:
        time.sleep(warm_s)
        skip, cpu0, started = len(state.ids), gw.cpu(), time.monotonic()
        time.sleep(seconds)
        measured, wall, cpu = state.ids[skip:], time.monotonic() - started, gw.cores(cpu0, seconds)
    complete = sink.wait(state.ids, timeout_s=120)
    lat = [entry_ms(sink.seen[i][0]) - entry_ms(i) for i in measured if i in sink.seen]
    lags = [lag for t, lag in state.lag if t >= started and lag is not None]
    return {
        "rate": round(rate, 1),
        "events": len(measured),
        "results": len(lat),
        "complete": complete,
        "offered_per_s": round(len(measured) / wall, 1),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat, default=None),
        "max_lag": max(lags, default=None),
        "lag_samples": len(lags),
        "breakdown_ms": breakdown(gw, sink, measured),
        "cpu_cores": cpu,
    }


def burst(
    gw: Gateway, pool: list[dict[str, str]], rate: float, burst_s: float, warm_s: float, timeout_s: float
) -> dict[str, Any]:
    """The steady producer; after ``warm_s`` (the steady level: its max lag), 10 x rate x ``burst_s`` events at once;
    until the lag is back at that level (or ``timeout_s``), 5 s more; then every event's results counted."""
    sink, cpu0, t0 = SinkReader(gw.client, SINK), gw.cpu(), time.monotonic()
    with load(gw, pool, rate) as state:
        time.sleep(warm_s)
        level, size = max((lag for _, lag in state.lag if lag is not None), default=0), round(10 * rate * burst_s)
        at = time.monotonic()
        burst_ids = append(gw.client, SOURCE, [pool[(k * 7) % len(pool)] for k in range(size)])
        appended_s, back = time.monotonic() - at, None
        while back is None and time.monotonic() - at < timeout_s:
            time.sleep(1.0)
            back = recovery_s(list(state.lag), at, level)
        time.sleep(5.0)
    wall, ids = time.monotonic() - t0, state.ids + burst_ids
    cpu, complete = gw.cores(cpu0, wall), sink.wait(ids, timeout_s=600)
    counts, metrics, seen = [len(sink.seen.get(i, [])) for i in ids], gw.api.get("/metrics").text, state.replicas
    trail = gw.api.get(f"/api/2.0/serving-endpoints/{ENDPOINT}/autoscaler").json()["decisions"]  # t: monotonic, as ours
    return {
        "rate": round(rate, 1),
        "burst_events": size,
        "burst_append_s": round(appended_s, 2),
        "steady_level": level,
        "peak_lag": max((lag or 0 for _, lag in state.lag), default=0),
        "recovery_s": back and round(back, 1),
        "events": len(ids),
        "complete": complete,
        "lost": counts.count(0),
        "doubled": sum(c > 1 for c in counts),
        "replicas": [(round(t - at, 1), v) for i, (t, v) in enumerate(seen) if i == 0 or v != seen[i - 1][1]],
        "peak_replicas": max((v[0] or 0 for _, v in seen), default=0),
        "lag": [(round(t - at, 1), lag) for t, lag in state.lag],
        "decisions": [
            (
                round(d["t"] - at, 1),
                d["replicas"],
                d["ready_replicas"],
                round(d["target_concurrency"], 1),
                d["inputs"].get("stream_drain"),
                d["reason"],
            )
            for d in trail
            if d["t"] > at - 10
        ],
        "retries": gauge(metrics, "tollfree_stream_events_total", ENDPOINT, 'outcome="retry"'),
        "cpu_cores": cpu,
    }


def versions() -> dict[str, str]:
    """The redis-server and the Python packages the figures depend on."""
    from importlib.metadata import version

    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    return {
        "redis-server": next((w[2:] for w in server if w.startswith("v=")), "?"),
        **{p: version(p) for p in ("redis", "httpx", "mlflow", "feast", "scikit-learn")},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Naive, ceiling and steady with the replicas pinned at ``--replicas``; the burst on the default scaling."""
    (work := Path(args.workdir)).mkdir(parents=True, exist_ok=True)
    pool, gw, report = events(home := world(work), max(args.backlog, args.naive) + 2_000), None, dict[str, Any]()
    try:
        gw = Gateway(work, home)
        gw.deploy(args.replicas, create=True)
        naive(gw, pool[-100:])  # warm-up
        report["naive"] = naive(gw, pool[: args.naive])
        ceiling(gw, pool[-2_000:])  # warm-up
        report["ceiling"] = ceiling(gw, pool[: args.backlog])
        rate = 0.5 * report["ceiling"]["events_per_s"]
        report["steady"] = steady(gw, pool, rate, args.warm_s, args.steady_s)
        log(f"naive {report['naive']}\nceiling {report['ceiling']}\nsteady {report['steady']}")
        gw.deploy(None, create=False)
        report["burst"] = burst(gw, pool, rate, args.burst_s, 2 * args.warm_s, args.recovery_timeout_s)
    finally:
        if gw is not None:
            gw.stop()
    report["verdicts"] = verdicts(report)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.streams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes, smaller figures)")
    parser.add_argument(
        "--workdir", default="/tmp/tollfree-bench-streams", help="TOLLFREE_HOME, redis, logs (world kept)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="replicas pinned for naive, ceiling and steady")
    args = parser.parse_args(argv)
    args.naive, args.backlog = (300, 5_000) if args.quick else (3_000, 50_000)
    args.warm_s, args.steady_s, args.burst_s, args.recovery_timeout_s = (
        (2.0, 8.0, 2.0, 60.0) if args.quick else (5.0, 30.0, 10.0, 180.0)
    )
    provenance = Provenance("benchmarks.streams", argv)
    phases = run(args)
    report = {
        **provenance.record(),
        "run": {
            "warm_pool": os.environ.get("TOLLFREE_WARM_POOL", "1"),
            "replicas": args.replicas,
            "versions": versions(),
        },
        **phases,
    }
    print(table(report) + "\n" + json.dumps(report))
    return 0 if all(v["pass"] for v in report["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
