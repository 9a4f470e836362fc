"""The generative benchmark's load client, a process of its own (``python -m benchmarks.generative --client SPEC``).

A closed loop of chat streams against one URL; per stream, the arrival time and kind of each server-sent
event, from which TTFT and inter-token latency come; the CPU seconds of the client and of the servers
(read from /proc) over the measured window.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvloop

from benchmarks.common import percentile


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
        "itl": [b - a for a, b in itertools.pairwise(tokens)],
        "tokens": len(tokens),
        "done": bool(events) and events[-1][1] == "done",
        "errors": sum(kind == "error" for _, kind in events),
    }


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

    def cpu() -> float:
        return sum(resource.getrusage(resource.RUSAGE_SELF)[:2])

    def servers() -> dict[str, float]:
        return {
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
        _, pending = await asyncio.wait([*tasks, lagger], timeout=spec["drain_s"])
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
