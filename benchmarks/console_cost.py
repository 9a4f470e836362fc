"""What a console open on an endpoint costs its data plane: the peers benchmark's tollfree c=32 point, with and
without the console's event streams held open, in alternating rounds on one gateway.

    python -m benchmarks.console_cost [--seconds 10] [--rounds 3] [--model light] [--json]

The server is the peers benchmark's ``tollfree`` (``python -m serving``, shipped defaults, the model logged with a
signature and no input example), the load its c=32 point: wrk, closed loop, keep-alive, one row a request, 2 s of
warm-up then ``--seconds`` timed. "Open": a client signed in to the console that holds what the endpoint's page
holds open, the endpoint's event stream (a point, its decisions and replicas every second) and the endpoints'
stream (every 2 s), reading every event; it runs in this process, as wrk does, on the same 2 cores. Each round
measures both, closed first in even rounds and open first in odd ones; the figure is each side's median and
the verdict their ratio against the target (open within 3 % of closed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import threading
from pathlib import Path
from typing import Any

import httpx

from benchmarks import peers_models
from benchmarks.common import Provenance, log
from benchmarks.serving_load import WARMUP_S, wrk
from benchmarks.serving_servers import VENV_BIN, Server, start_tollfree, throwaway_home

CONCURRENCY = 32
TARGET = 0.97  # open over closed, rps


class ConsoleOpen:
    """A signed-in console client holding the endpoint's and the endpoints' event streams, reading every event."""

    def __init__(self, server: Server, token: str, endpoint: str) -> None:
        self.events = 0
        self._stop = threading.Event()
        self._client = httpx.Client(base_url=server.url, timeout=30)
        signed = self._client.post("/console/sign-in", data={"token": token})
        if signed.status_code != 303:
            raise RuntimeError(f"console sign-in answered {signed.status_code}")
        paths = (f"/console/api/endpoints/{endpoint}/events", "/console/api/events")
        self._threads = [threading.Thread(target=self._read, args=(p,), daemon=True) for p in paths]
        for thread in self._threads:
            thread.start()

    def _read(self, path: str) -> None:
        with self._client.stream("GET", path, timeout=None) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    self.events += 1
                if self._stop.is_set():
                    return

    def close(self) -> int:
        self._stop.set()
        self._client.close()  # ends the streams the readers hold
        for thread in self._threads:
            thread.join(10)
        return self.events


def _measure(server: Server, body: str, seconds: int, script: Path) -> dict[str, float]:
    wrk(server, body, CONCURRENCY, WARMUP_S, script)
    result = wrk(server, body, CONCURRENCY, seconds, script)
    errors = sum(result[k] for k in ("non2xx", "connect", "read", "write", "timeout"))
    return {
        "rps": result["requests"] / (result["duration_us"] / 1e6),
        "p99_ms": result["p99_us"] / 1000,
        "errors": errors,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = throwaway_home("tollfree-bench-console-")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    provenance = Provenance("benchmarks.console_cost", None)
    try:
        model = peers_models.prepare([args.model], home)[args.model]
        server = start_tollfree(model["plain"], env, home / "logs", kind="tollfree", entity={})
        token = server.headers["Authorization"].removeprefix("Bearer ")
        path, body, headers = peers_models.request("tollfree", model, 1)
        target = Server("tollfree", server.url, path or server.path, {**server.headers, **headers}, server.pid, None)
        points: dict[str, list[dict[str, float]]] = {"closed": [], "open": []}
        events = 0
        try:
            for round_no in range(args.rounds):
                for side in ("closed", "open") if round_no % 2 == 0 else ("open", "closed"):
                    console = ConsoleOpen(server, token, "bench") if side == "open" else None
                    try:
                        point = _measure(target, body, args.seconds, home / "post.lua")
                    finally:
                        if console is not None:
                            events += console.close()
                    points[side].append(point)
                    log(f"round {round_no + 1}, console {side}: {point['rps']:.0f} rps, p99 {point['p99_ms']:.1f} ms")
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)
    closed = statistics.median(p["rps"] for p in points["closed"])
    opened = statistics.median(p["rps"] for p in points["open"])
    ratio = opened / closed
    return {
        **provenance.record(),
        "model": args.model,
        "concurrency": CONCURRENCY,
        "seconds_per_point": args.seconds,
        "warmup_s": WARMUP_S,
        "points": points,
        "console_events_read": events,
        "median_rps": {"closed": round(closed, 1), "open": round(opened, 1)},
        "ratio": round(ratio, 4),
        "verdict": f"open over closed {ratio:.3f} (target >= {TARGET}): {'PASS' if ratio >= TARGET else 'FAIL'}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.console_cost", description=__doc__)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="light", choices=sorted(peers_models.MODELS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        closed, opened = result["median_rps"]["closed"], result["median_rps"]["open"]
        print(
            f"c={CONCURRENCY}: {closed:,.0f} rps without the console, {opened:,.0f} with it open; {result['verdict']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
