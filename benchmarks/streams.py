"""Stream inputs: tollfree's consumer against a naive one, its ceiling, p99 at half of it, a 10x burst.

    python -m benchmarks.streams [--quick] [--workdir DIR] [--replicas 1]

A real redis-server and gateway (``python -m serving``) on 127.0.0.1 serve the world's ``fraud@champion`` as
``fraud-stream``; see benchmarks/README.md (``streams``) for the phases, the targets and the results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import psutil
import redis

from benchmarks.batch_setup import environ, log
from feature_repo import synthetic
from infra.redis import RedisServer
from serving.gateway.process import start_gateway, wait_endpoint_ready
from serving.inference_log import read_inference_log
from serving.replicas.local import free_port
from serving.streams.broker import entry_ms
from tests.world import build_world

ENDPOINT, SOURCE, SINK, DEAD, GROUP = "fraud-stream", "tx", "scores", "tx-dead", "tollfree"
NAIVE_SOURCE, NAIVE_SINK = "naive-tx", "naive-scores"
P99_MS, RATIO, RECOVERY_S = 50.0, 5.0, 60.0
ROLES = ("gateway", "replicas", "redis", "bench")


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered) - 1e-9) - 1))] if ordered else math.nan


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def due(rate: float, elapsed_s: float) -> int:
    """Events a producer at ``rate``/s has to have appended ``elapsed_s`` after its start (the first at 0)."""
    return 0 if elapsed_s < 0 else int(rate * elapsed_s + 1e-9) + 1


def drain_rate(sink_ids: Iterable[str]) -> float:
    """Results per second between the first and the last of ``sink_ids`` (by their ms); 0 if under 1 ms apart."""
    ms = sorted(entry_ms(i) for i in sink_ids)
    return (len(ms) - 1) / ((ms[-1] - ms[0]) / 1000) if len(ms) > 1 and ms[-1] > ms[0] else 0.0


def group_lag(groups: list[dict], group: str) -> int | None:
    """The group's unacknowledged entries from XINFO GROUPS (``lag`` + ``pending``); None if missing or unknown."""
    info = next(
        (i for i in ({_text(k): v for k, v in g.items()} for g in groups) if _text(i.get("name")) == group), None
    )
    return None if info is None or info.get("lag") is None else int(info["lag"]) + int(info["pending"])


def gauge(metrics: str, name: str, endpoint: str, label: str = "") -> float | None:
    """The sum of a Prometheus family's samples for ``endpoint`` (and ``label``, e.g. ``outcome="retry"``); None if none."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") and f'endpoint="{endpoint}"' in line and label in line
    ]
    return sum(values) if values else None


def recovery_s(samples: list[tuple[float, int | None]], since: float, level: float) -> float | None:
    """Seconds from ``since`` to the first sample whose lag is at or below ``level`` again after one above it
    (the burst seen: samples taken while it was still being appended do not count); None: none yet."""
    above = next((t for t, lag in samples if t > since and lag is not None and lag > level), None)
    if above is None:
        return None
    return next((t - since for t, lag in samples if t > above and lag is not None and lag <= level), None)


def world(work: Path) -> Path:
    """``tests.world.build_world`` in ``work/home``, reused on the day it was built (the features stay in TTL)."""
    home, marker, today = work / "home", work / "world.json", datetime.now(UTC).date().isoformat()
    os.environ.update(
        environ(home, TOLLFREE_TOKEN=os.environ.get("TOLLFREE_TOKEN") or "bench-" + secrets.token_hex(16))
    )
    if not marker.exists() or json.loads(marker.read_text()).get("day") != today:
        shutil.rmtree(home, ignore_errors=True)
        log(f"building the world in {home} (the materialize and train flows) ...")
        build_world()
        marker.write_text(json.dumps({"day": today}))
    return home


def events(home: Path, n: int) -> list[dict[str, str]]:
    rows = synthetic.read_transactions(home / "data").sample(frac=1.0, random_state=7)
    out = [
        {"customer_id": str(c), "merchant_id": str(m), "amount": repr(float(a))}
        for c, m, a in zip(rows["customer_id"], rows["merchant_id"], rows["amount"])
    ]
    return [out[i % len(out)] for i in range(n)]


def append(client: Any, stream: str, batch: list[dict[str, str]]) -> list[str]:
    """``batch`` appended in one pipeline (XADD each); their ids."""
    pipe = client.pipeline(transaction=False)
    for event in batch:
        pipe.xadd(stream, event)
    return [i.decode() for i in pipe.execute()]


class SinkReader:
    """A stream's new entries, read incrementally: event id -> the sink ids of its results."""

    def __init__(self, client: Any, stream: str) -> None:
        last = client.xrevrange(stream, "+", "-", count=1)
        self.client, self.stream, self.cursor = client, stream, "(" + (last[0][0].decode() if last else "0-0")
        self.seen: dict[str, list[str]] = {}

    def poll(self) -> dict[str, list[str]]:
        while chunk := self.client.xrange(self.stream, self.cursor, "+", count=10_000):
            for sink_id, fields in chunk:
                self.seen.setdefault(fields[b"event_id"].decode(), []).append(sink_id.decode())
            self.cursor = "(" + chunk[-1][0].decode()
        return self.seen

    def wait(self, ids: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not all(map(self.poll().__contains__, ids)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


class Gateway:
    """This run's redis-server and gateway, the endpoint, and CPU seconds per process."""

    def __init__(self, work: Path, home: Path) -> None:
        for stale in [
            *work.glob("redis"),
            *home.glob("endpoints.db*"),
        ]:  # a fresh broker and state store (no autoscaler
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()  # state kept from an earlier run's endpoint)
        self.home, self.redis = home, RedisServer(free_port(), work / "redis").start()  # persistent, as the stack's
        self.client, self.token = redis.Redis(port=self.redis.port), os.environ["TOLLFREE_TOKEN"]
        self.process = start_gateway(dict(os.environ), home / "logs" / "gateway-streams-bench.log", timeout_s=240)
        self.api = httpx.Client(
            base_url=self.process.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=120
        )

    def deploy(self, replicas: int | None, create: bool) -> None:
        """The endpoint with ``replicas`` pinned (None: the default scaling), the stream input's default batching."""
        url, entity = self.redis.url, {"entity_name": "fraud", "entity_alias": "champion"}
        pinned = {"min_replicas": replicas, "max_replicas": replicas} if replicas else {}
        config = {
            "served_entities": [{**entity, **pinned}],
            "stream_inputs": [
                {
                    "source": f"{url}/{SOURCE}",
                    "sink": f"{url}/{SINK}",
                    "dead_letter": f"{url}/{DEAD}",
                    "group": GROUP,
                    "batch_size": 100,
                    "max_wait_ms": 10,
                }
            ],
        }
        answer = (
            self.api.post("/api/2.0/serving-endpoints", json={"name": ENDPOINT, "config": config})
            if create
            else self.api.put(f"/api/2.0/serving-endpoints/{ENDPOINT}/config", json=config)
        )
        answer.raise_for_status()
        wait_endpoint_ready(self.process.url, self.token, ENDPOINT, timeout_s=300)

    def cpu(self) -> dict[int, tuple[str, float]]:
        """pid -> (role, user + system CPU seconds) of the gateway, its children (replicas, standby), redis, this process."""
        procs = [
            ("gateway", self.process.process.pid),
            ("redis", getattr(self.redis.process, "pid", 0)),
            ("bench", os.getpid()),
        ]
        procs += [("replicas", c.pid) for c in psutil.Process(self.process.process.pid).children(recursive=True)]
        out = {}
        for role, pid in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                out[pid] = (role, sum(psutil.Process(pid).cpu_times()[:2]))
        return out

    def stop(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.api.delete(f"/api/2.0/serving-endpoints/{ENDPOINT}")
        self.process.stop(grace_s=60)
        self.redis.stop()

    def cores(self, before: dict[int, tuple[str, float]], seconds: float) -> dict[str, float]:
        """Cores used per role since ``before`` (``cpu()`` then), over ``seconds``; a process that ended is not counted."""
        out = dict.fromkeys(ROLES, 0.0)
        for pid, (role, cpu) in self.cpu().items():
            out[role] += cpu - before.get(pid, (role, 0.0))[1]
        return {role: round(v / seconds, 2) for role, v in out.items()}


def naive(gw: Gateway, batch: list[dict[str, str]]) -> dict[str, Any]:
    """The issue's naive consumer: one XREAD of one entry, one HTTP invocation, one XADD, per event, in turn."""
    gw.client.delete(NAIVE_SOURCE)  # read from its start: the whole batch is in it before the clock starts
    last, ids, sink = "0-0", append(gw.client, NAIVE_SOURCE, batch), SinkReader(gw.client, NAIVE_SINK)
    url, done = f"{gw.process.url}/serving-endpoints/{ENDPOINT}/invocations", 0
    cpu0, started = gw.cpu(), time.monotonic()
    with httpx.Client(headers={"Authorization": f"Bearer {gw.token}"}, timeout=30) as http:
        while done < len(ids):
            entry_id, fields = gw.client.xread({NAIVE_SOURCE: last}, count=1)[0][1][0]  # type: ignore[index]
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


def verdicts(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's three targets, PASS/FAIL with the figure; "bounded" lag: never a second of events behind."""
    c, n, s, b = r["ceiling"], r["naive"], r["steady"], r["burst"]
    ratio, rec = c["events_per_s"] / n["events_per_s"] if n["events_per_s"] else math.inf, b["recovery_s"]
    return [
        {
            "target": f"throughput >= {RATIO:g}x the naive consumer",
            "pass": ratio >= RATIO and c["complete"],
            "figure": f"{ratio:.1f}x ({c['events_per_s']} vs {n['events_per_s']} events/s)",
        },
        {
            "target": f"at 50 % of the ceiling: p99 <= {P99_MS:g} ms, lag bounded (<= 1 s of events)",
            "pass": s["p99_ms"] <= P99_MS and s["max_lag"] is not None and s["max_lag"] <= s["rate"] and s["complete"],
            "figure": f"p99 {s['p99_ms']} ms (p50 {s['p50_ms']}, max {s['max_ms']}), max lag {s['max_lag']} at {s['rate']}/s",
        },
        {
            "target": f"10x burst: lag back to steady within {RECOVERY_S:g} s, no event lost or doubled",
            "pass": rec is not None and rec <= RECOVERY_S and b["lost"] == 0 and b["doubled"] == 0 and b["complete"],
            "figure": f"back in {rec} s (level {b['steady_level']}, peak {b['peak_lag']}); lost {b['lost']}, doubled "
            f"{b['doubled']} of {b['events']}; replicas up to {b['peak_replicas']:g}",
        },
    ]


def table(r: dict[str, Any]) -> str:
    n, c, s, b, k = r["naive"], r["ceiling"], r["steady"], r["burst"], r["run"]["replicas"]
    rows = [
        (f"naive consumer, {k} replica", n["results"], n["events_per_s"], "", "", n),
        (f"tollfree ceiling, {k} replica", c["results"], c["events_per_s"], "", "", c),
        (
            f"tollfree at 50 %, {k} replica",
            s["results"],
            f"{s['offered_per_s']} offered",
            f"{s['p50_ms']} / {s['p99_ms']}",
            s["max_lag"],
            s,
        ),
        (
            "10x burst, scaling 1-4",
            f"{b['burst_events']} + {b['events'] - b['burst_events']}",
            f"{b['rate']} + burst",
            "",
            f"{b['peak_lag']}, back in {b['recovery_s']} s",
            b,
        ),
    ]
    lines = [
        "| phase | events | events/s | p50 / p99 ms | max lag | cores: gateway / replicas / redis / bench |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for *cells, phase in rows:
        used = " / ".join(f"{phase['cpu_cores'][x]:.2f}" for x in ROLES)
        lines.append("| " + " | ".join([*map(str, cells), used]) + " |")
    lines += [f"{'PASS' if v['pass'] else 'FAIL'}  {v['target']}: {v['figure']}" for v in r["verdicts"]]
    lines.append("steady latency p50/p99 ms by part: " + ", ".join(f"{p} {v}" for p, v in s["breakdown_ms"].items()))
    lines.append("replicas (s from the burst: ready, desired): " + ", ".join(f"{t}: {v}" for t, v in b["replicas"]))
    return "\n".join(lines)


def versions() -> dict[str, str]:
    from importlib.metadata import version

    server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.split()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    return {
        "python": platform.python_version(),
        "redis-server": next((w[2:] for w in server if w.startswith("v=")), "?"),
        "commit": commit.stdout.strip(),
        "cpus": str(os.cpu_count()),
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
    before, started = os.getloadavg(), time.time()
    report = run(args)
    report["run"] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "warm_pool": os.environ.get("TOLLFREE_WARM_POOL", "1"),
        "seconds": round(time.time() - started),
        "command": " ".join(["python -m benchmarks.streams", *(sys.argv[1:] if argv is None else argv)]),
        "loadavg_before": [round(x, 2) for x in before],
        "replicas": args.replicas,
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
    }
    print(table(report) + "\n" + json.dumps(report))
    return 0 if all(v["pass"] for v in report["verdicts"]) else 1


if __name__ == "__main__":
    sys.exit(main())
