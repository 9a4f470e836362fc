"""Chat streams: what the gateway adds to a replica's TTFT and inter-token latency, what the external-model proxy relays.

    python -m benchmarks.generative [--streams 1,100,500] [--seconds 20] [--proxy-interval-s 0|none] [--out PATH]

A temp ``TOLLFREE_HOME``, the ticker (benchmarks/ticker_chat.py), a replica started here, a gateway with ``chat``
(the ticker) and ``proxy`` (an external model: the gateway's own OpenAI route for ``chat``); per N, a closed loop of N
streams from a load client of its own against (a) the replica, (b) ``chat``, (c) ``proxy``. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from benchmarks.batch_setup import environ, log

TTFT_MS, ITL_MS, PROXY_TOKENS_S, TARGET_STREAMS = 5.0, 2.0, 20_000, 500
PROMPT = "tick tock"


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered) - 1e-9) - 1))] if ordered else math.nan


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The ``data`` of each complete server-sent event in ``buffer`` (events end with a blank line), and the rest."""
    *whole, rest = buffer.split(b"\n\n")
    return [e[5:].strip() for e in whole if e.startswith(b"data:")], rest


def event_kind(data: bytes) -> str:
    """``done`` ([DONE]), ``error`` (an error event), ``token`` (a chunk with content) or ``other`` (role, usage)."""
    if data == b"[DONE]":
        return "done"
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "other"
    if not isinstance(chunk, dict) or "error" in chunk:
        return "error" if isinstance(chunk, dict) else "other"
    choices = chunk.get("choices") or []
    return "token" if any(isinstance(c, dict) and (c.get("delta") or {}).get("content") for c in choices) else "other"


def stream_figures(sent: float, events: list[tuple[float, str]]) -> dict[str, Any]:
    """One stream's figures from its timeline: ``sent`` (the request's time) and (arrival time, kind) per event.
    TTFT: the first token's time - sent; ITL: the gaps between consecutive tokens (0 for two in the same read);
    done: [DONE] is the last event; errors: error events."""
    tokens = [t for t, kind in events if kind == "token"]
    return {
        "ttft": tokens[0] - sent if tokens else None,
        "itl": [b - a for a, b in zip(tokens, tokens[1:])],
        "tokens": len(tokens),
        "done": bool(events) and events[-1][1] == "done",
        "errors": sum(kind == "error" for _, kind in events),
    }


def summarize(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The load clients' results of one run merged: counts summed, percentiles over every stream's figures."""
    ttft, itl = [x for p in parts for x in p["ttft_ms"]], [x for p in parts for x in p["itl_ms"]]
    window, add = max(p["window_s"] for p in parts), lambda k: sum(p[k] for p in parts)
    failures = dict(sum((Counter(p["failures"]) for p in parts), Counter()))
    return {
        "streams": add("streams"),
        "completed": add("completed"),
        "dropped": add("dropped"),
        "errors": add("errors"),
        "short": add("short"),
        "failures": failures,
        "window_s": round(window, 2),
        "ttft_ms": [round(percentile(ttft, 50), 2), round(percentile(ttft, 99), 2)],
        "itl_ms": [round(percentile(itl, 50), 2), round(percentile(itl, 99), 2)],
        "tokens_per_s": round(add("tokens") / window, 1),
        "client_cores": round(add("cpu_s") / window, 2),
        "loop_lag_p99_ms": max(p["loop_lag_p99_ms"] for p in parts),
    }


def verdicts(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The issue's targets on the runs of ``n`` streams: the gateway's added p99 TTFT and ITL (b - a), no stream
    dropped on any path, the proxy's tokens/s (and its ceiling's, if that row was run)."""
    at = {r["path"]: r for r in rows if r["n"] == n}
    a, b, c, where, out = at.get("replica"), at.get("gateway"), at.get("proxy"), f"at {n} streams", []
    if a and b:
        for key, limit, what in (("ttft_ms", TTFT_MS, "TTFT"), ("itl_ms", ITL_MS, "ITL")):
            added = round(b[key][1] - a[key][1], 2)
            out.append(
                {
                    "target": f"gateway adds <= {limit:g} ms p99 {what} {where}",
                    "pass": added <= limit,
                    "figure": f"{added:+} ms (p99 {b[key][1]} through the gateway, {a[key][1]} from the replica)",
                }
            )
    dropped = {r["path"]: r["dropped"] for r in at.values()}
    out.append(
        {
            "target": f"no stream dropped {where}",
            "pass": not any(dropped.values()) and bool(dropped),
            "figure": ", ".join(f"{p} {d}" for p, d in dropped.items()) + " dropped",
        }
    )
    for row, label in ((c, "proxy"), (at.get("proxy-ceiling"), "proxy ceiling (ticker at 0 ms, extra)")):
        if row:
            out.append(
                {
                    "target": f"{label} relays >= {PROXY_TOKENS_S:,} tokens/s {where}",
                    "pass": row["tokens_per_s"] >= PROXY_TOKENS_S and not row["dropped"],
                    "figure": f"{row['tokens_per_s']:,.0f} tokens/s, {row['dropped']} dropped",
                }
            )
    return out


def table(rows: list[dict[str, Any]], checks: list[dict[str, Any]]) -> str:
    """The markdown table of every run, then the verdicts (PASS/FAIL, or ``info`` for those off the target's N)."""
    lines = [
        "| N | path | streams (dropped / errors) | TTFT p50 / p99 ms | ITL p50 / p99 ms | tokens/s | "
        "cores: client / replicas / gateway (machine) | CPU us/token: replicas / gateway | client lag p99 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        cores, per = r["cores"], r["us_per_token"]
        lines.append(
            f"| {r['n']} | {r['label']} | {r['streams']:,} ({r['dropped']} / {r['errors']}) | "
            f"{r['ttft_ms'][0]} / {r['ttft_ms'][1]} | {r['itl_ms'][0]} / {r['itl_ms'][1]} | "
            f"{r['tokens_per_s']:,.0f} | {r['client_cores']:.2f} / {cores['replicas']:.2f} / "
            f"{cores['gateway']:.2f} ({cores.get('machine', math.nan):.2f}) | {per['replicas']} / {per['gateway']} | "
            f"{r['loop_lag_p99_ms']} |"
        )
    marks = {(True, True): "PASS", (True, False): "FAIL", (False, True): "info: met", (False, False): "info: missed"}
    lines += ["", *(f"- **{marks[v.get('of_record', True), v['pass']]}** {v['target']}: {v['figure']}" for v in checks)]
    return "\n".join(lines)


def per_token_us(cpu_s: dict[str, float], tokens: float) -> dict[str, float | None]:
    """CPU microseconds per token delivered, per role (None without tokens)."""
    return {role: round(s / tokens * 1e6, 1) if tokens else None for role, s in cpu_s.items()}


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` from /proc/PID/stat (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds of all cores busy (user, nice, system, irq, softirq) since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        ticks = [int(x) for x in stat.readline().split()[1:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


async def _stream(session: Any, spec: dict[str, Any], window: tuple[float, float], out: dict[str, Any]) -> None:
    events: list[tuple[float, str]] = []
    buffer, status, sent = b"", "cancelled", time.perf_counter()
    try:
        async with session.post(spec["url"], data=spec["body"], headers=spec["headers"]) as answer:
            status = str(answer.status)
            if answer.status != 200:
                await answer.read()
            else:
                async for piece in answer.content.iter_any():
                    now = time.perf_counter()
                    datas, buffer = split_events(buffer + piece)
                    events += [(now, event_kind(d)) for d in datas]
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        status = type(exc).__name__
    finally:
        fig = stream_figures(sent, events)
        ok = status == "200" and fig["done"]
        out["dropped"] += not ok
        out["errors"] += fig["errors"]
        out["failures"][status] = out["failures"].get(status, 0) + (not ok)  # "200": 0 (summarize drops zeros)
        out["tokens"] += sum(window[0] <= t < window[1] for t, kind in events if kind == "token")
        if window[0] <= sent < window[1]:
            out["streams"] += 1
            out["completed"] += ok
            out["short"] += fig["tokens"] != spec["max_tokens"]
            out["ttft_ms"] += [round(fig["ttft"] * 1000, 3)] if fig["ttft"] is not None else []
            out["itl_ms"] += [round(x * 1000, 3) for x in fig["itl"]]


async def _lag(until: float, window: tuple[float, float], lags: list[float]) -> None:
    """The event loop's lag: how late a 10 ms sleep wakes up, sampled over the window."""
    while (t := time.perf_counter()) < until:
        await asyncio.sleep(0.01)
        if window[0] <= t < window[1]:
            lags.append((time.perf_counter() - t - 0.01) * 1000)


async def client(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec["streams"]`` workers, each starting a new stream as soon as its last ended (closed loop), the first
    ones spread over ``ramp_s``; from ``start_at`` (wall clock) + ``warm_s``, ``seconds`` measured; then no new
    stream, and those in flight get ``drain_s`` to end (still running then: cancelled, counted as dropped)."""
    start = spec["start_at"] - (time.time() - time.perf_counter())  # the wall-clock start on this perf_counter
    window = (start + spec["warm_s"], start + spec["warm_s"] + spec["seconds"])
    out: dict[str, Any] = dict.fromkeys(("streams", "completed", "dropped", "errors", "short", "tokens"), 0)
    out.update(failures={}, ttft_ms=[], itl_ms=[], window_s=spec["seconds"])
    lags: list[float] = []

    async def worker(delay: float) -> None:
        await asyncio.sleep(delay)
        while time.perf_counter() < window[1]:
            await _stream(session, spec, window, out)

    cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])  # noqa: E731
    servers = lambda: {
        **{role: sum(map(proc_cpu_s, pids)) for role, pids in spec["pids"].items()},
        **({"machine": machine_busy_s()} if spec["pids"] else {}),
    }
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as session:
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        tasks = [asyncio.ensure_future(worker(spec["ramp_s"] * i / spec["streams"])) for i in range(spec["streams"])]
        lagger = asyncio.ensure_future(_lag(window[1], window, lags))
        await asyncio.sleep(max(0.0, window[0] - time.perf_counter()))
        cpu0, servers0 = cpu(), servers()
        await asyncio.sleep(max(0.0, window[1] - time.perf_counter()))
        out["cpu_s"], servers1 = cpu() - cpu0, servers()
        out["servers_cpu_s"] = {role: round(servers1[role] - servers0[role], 2) for role in servers1}
        _, pending = await asyncio.wait(tasks + [lagger], timeout=spec["drain_s"])
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    out["loop_lag_p99_ms"] = round(percentile(lags, 99), 2)
    return out


def client_main(spec_path: str) -> int:
    """Runs ``client`` on the spec in the JSON file ``spec_path``; its result goes to the spec's ``out`` path."""
    spec = json.loads(Path(spec_path).read_text())
    Path(spec["out"]).write_text(json.dumps(uvloop.run(client(spec))))
    return 0


class Stack:
    """A temp home, the ticker, a replica started here, the gateway with its endpoints; ``stop`` ends all of them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.home = args, Path(tempfile.mkdtemp(prefix="tollfree-bench-generative-"))
        self.gateway: Any = None
        self.token, self.replica_token, self.replica_url = "bench-" + secrets.token_hex(16), secrets.token_hex(16), ""
        self.children: list[Any] = []  # the processes started here: the replica, the load clients

    def start(self) -> None:
        import httpx
        import mlflow

        from benchmarks.ticker_chat import log_ticker
        from serving.gateway.process import start_gateway, wait_endpoint_ready
        from serving.protocol.wire import REPLICA_TOKEN_ENV
        from serving.registry.versions import ensure_experiment
        from serving.replicas.local import start_replica, wait_ready

        env = environ(self.home, TOLLFREE_TOKEN=self.token, TOLLFREE_WARM_POOL="0")
        os.environ.update(env)  # log_ticker registers in this process's tracking URI
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        mlflow.set_experiment(
            experiment_id=ensure_experiment(mlflow.MlflowClient(), "bench-generative", self.home / "mlartifacts")
        )
        version = log_ticker("ticker", interval_s=self.args.interval_s)
        fast = (
            None if self.args.proxy_interval_s is None else log_ticker("ticker", interval_s=self.args.proxy_interval_s)
        )
        logs = self.home / "logs"  # the replica as the gateway starts one (its own session, this process its owner)
        replica = start_replica(
            f"models:/ticker/{version}", logs / "direct", {**env, REPLICA_TOKEN_ENV: self.replica_token}
        )
        self.children, self.replica_url = [replica.process], replica.url
        (key := self.home / "secrets" / "bench" / "key").parent.mkdir(parents=True)
        key.write_text(self.token)  # the upstream is this gateway: its key is the admin token
        self.gateway = start_gateway(env, logs / "gateway.log", timeout_s=240)
        endpoints = {"chat": version, "proxy": "chat"} | (
            {"chat-fast": fast, "proxy-fast": "chat-fast"} if fast else {}
        )
        with httpx.Client(
            base_url=self.gateway.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        ) as api:
            for name, what in endpoints.items():
                entity = (
                    {
                        "entity_name": "ticker",
                        "entity_version": what,
                        "min_replicas": 1,
                        "max_replicas": 1,
                        "max_concurrency": 4096,
                    }
                    if name.startswith("chat")
                    else {
                        "name": "upstream",
                        "external_model": {
                            "name": what,
                            "provider": "openai",
                            "task": "llm/v1/chat",
                            "openai_config": {
                                "openai_api_key": "{{secrets/bench/key}}",
                                "openai_api_base": f"{self.gateway.url}/serving-endpoints",
                            },
                        },
                    }
                )
                api.post(
                    "/api/2.0/serving-endpoints", json={"name": name, "config": {"served_entities": [entity]}}
                ).raise_for_status()
        for name in endpoints:
            wait_endpoint_ready(self.gateway.url, self.token, name, timeout_s=300)
        wait_ready(replica, timeout_s=180)
        log(f"ready: replica {self.replica_url}, gateway {self.gateway.url}, home {self.home}")

    def pids(self) -> dict[str, list[int]]:
        """The server processes by role: the replicas (the direct one and the gateway's), the gateway."""
        import psutil

        ours = [c.pid for c in psutil.Process(self.gateway.process.pid).children(recursive=True)]
        return {"replicas": [self.children[0].pid, *ours], "gateway": [self.gateway.process.pid]}

    def stop(self) -> None:
        import psutil

        left: list[Any] = []
        if self.gateway is not None:
            with contextlib.suppress(psutil.Error):
                left = psutil.Process(self.gateway.process.pid).children(recursive=True)
            self.gateway.stop(grace_s=30)
        for child in [*self.children, *left]:  # SIGTERM; SIGKILL if still there 10 s later
            with contextlib.suppress(psutil.Error, OSError, subprocess.TimeoutExpired):
                child.terminate()
                child.wait(10)
            with contextlib.suppress(psutil.Error, OSError):
                child.kill()
        if not self.args.keep_home:
            shutil.rmtree(self.home, ignore_errors=True)


def targets(stack: Stack, args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, str]]]:
    """(path, label, url, headers) of each run, in order."""
    auth = lambda token: {"Authorization": f"Bearer {token}", "content-type": "application/json"}  # noqa: E731
    gw, admin = stack.gateway.url, auth(stack.token)
    out = [
        ("replica", "(a) replica", f"{stack.replica_url}/invocations", auth(stack.replica_token)),
        ("gateway", "(b) gateway", f"{gw}/serving-endpoints/chat/invocations", admin),
        ("proxy", "(c) proxy (gateway twice)", f"{gw}/serving-endpoints/proxy/invocations", admin),
    ]
    if args.proxy_interval_s is not None:
        out.append(
            (
                "proxy-ceiling",
                f"(c) proxy, ticker at {args.proxy_interval_s * 1000:g} ms (ceiling, extra)",
                f"{gw}/serving-endpoints/proxy-fast/invocations",
                admin,
            )
        )
    return [t for t in out if args.paths is None or t[0] in args.paths]


def run_one(
    stack: Stack, args: argparse.Namespace, n: int, path: str, label: str, url: str, headers: dict[str, str]
) -> dict[str, Any]:
    """N streams against one path in ``--clients`` client processes; the row of the table."""
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    k, start_at, pids, load = min(args.clients, n), time.time() + 2.0, stack.pids(), os.getloadavg()
    procs = []
    for i in range(k):
        spec = {
            "url": url,
            "headers": headers,
            "body": body,
            "streams": n // k + (i < n % k),
            "start_at": start_at,
            "warm_s": args.warmup_s,
            "seconds": args.seconds,
            "ramp_s": min(args.warmup_s, 1.0),
            "drain_s": 30.0,
            "max_tokens": args.max_tokens,
            "pids": pids if i == 0 else {},
        }
        (file := stack.home / f"client-{i}.json").write_text(json.dumps({**spec, "out": str(file) + ".out"}))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.generative", "--client", str(file)], start_new_session=True
            )
        )
    stack.children += procs
    for proc in procs:
        if proc.wait(timeout=args.warmup_s + args.seconds + 120) != 0:
            raise RuntimeError(f"a load client exited with code {proc.returncode}")
    parts = [json.loads((stack.home / f"client-{i}.json.out").read_text()) for i in range(k)]
    row = {"n": n, "path": path, "label": label, "loadavg_before": [round(x, 2) for x in load], **summarize(parts)}
    cpu_s = parts[0]["servers_cpu_s"]
    row["cores"] = {role: round(s / row["window_s"], 2) for role, s in cpu_s.items()}
    row["us_per_token"] = per_token_us(
        cpu_s | {"client": sum(p["cpu_s"] for p in parts)}, row["tokens_per_s"] * row["window_s"]
    )
    log(f"N={n} {label}: {json.dumps({key: v for key, v in row.items() if key not in ('n', 'path', 'label')})}")
    return row


def versions() -> dict[str, str]:
    from importlib.metadata import version

    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    return {
        "python": platform.python_version(),
        "commit": git.stdout.strip(),
        "nproc": str(os.cpu_count()),
        **{p: version(p) for p in ("aiohttp", "uvicorn", "uvloop", "mlflow")},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    stack, rows = Stack(args), []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM cleans up as Ctrl-C does
    try:
        stack.start()
        for n in args.streams:
            for path in targets(stack, args):
                time.sleep(args.pause_s)  # each run starts on a machine at rest
                rows.append(run_one(stack, args, n, *path))
    finally:
        stack.stop()
        signal.signal(signal.SIGTERM, previous)
    at = TARGET_STREAMS if TARGET_STREAMS in args.streams else max(args.streams)  # other N: the gateway's figures
    return {
        "rows": rows,
        "verdicts": verdicts(rows, at)
        + [
            {**v, "of_record": False}
            for n in args.streams
            if n != at
            for v in verdicts(rows, n)
            if "tokens/s" not in v["target"]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return client_main(argv[1])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generative", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streams",
        default="1,100,500",
        type=lambda s: [int(x) for x in s.split(",")],
        help="concurrent streams, one run per value and path",
    )
    for flag, default, what in (
        ("--max-tokens", 50, "max_tokens of every request"),
        ("--seconds", 20.0, "measured seconds per run"),
        ("--warmup-s", 3.0, "seconds of load before the measured part"),
        ("--pause-s", 7.0, "idle seconds before each run"),
        ("--interval-s", 0.02, "the ticker's seconds between tokens"),
        ("--clients", 1, "load-client processes"),
    ):
        parser.add_argument(flag, type=type(default), default=default, help=what + " (default %(default)s)")
    parser.add_argument(
        "--proxy-interval-s",
        default="0",
        type=lambda s: None if s == "none" else float(s),
        help="an extra proxy row with the ticker at this interval (its ceiling); none: no extra row",
    )
    parser.add_argument(
        "--paths", type=lambda s: s.split(","), help="only these of replica,gateway,proxy,proxy-ceiling"
    )
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument("--keep-home", action="store_true", help="keep the temp TOLLFREE_HOME (logs) at the end")
    args = parser.parse_args(argv)
    before, started = os.getloadavg(), time.time()
    report = run(args)
    report["run"] = {
        "date": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.generative", *argv]),
        "seconds": round(time.time() - started),
        "loadavg_before": [round(x, 2) for x in before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "versions": versions(),
        "args": vars(args),
    }
    print(table(report["rows"], report["verdicts"]))
    Path(args.out).write_text(json.dumps(report, indent=1)) if args.out else None
    return 0 if all(v["pass"] for v in report["verdicts"] if v.get("of_record", True)) else 1


if __name__ == "__main__":
    sys.exit(main())
