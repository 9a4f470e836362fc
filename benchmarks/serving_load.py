"""The serving benchmark's measurement (benchmarks/serving.py): wrk's closed-loop load on one server, and the
CPU its whole process tree used over the timed window, read from /proc."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.common import log
from benchmarks.serving_servers import Server

WARMUP_S = 2
CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_table() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime ticks) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # fields from state (3rd) on
        table[int(entry)] = (int(fields[1]), int(fields[11]) + int(fields[12]))
    return table


def tree_cpu(root: int) -> dict[int, int]:
    """pid -> CPU ticks for ``root`` and all its live descendants."""
    table = proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, stack = {}, [root]
    while stack:
        pid = stack.pop()
        if pid in table and pid not in found:
            found[pid] = table[pid][1]
            stack.extend(children.get(pid, []))
    return found


def cpu_delta(root: int, before: dict[int, int], after: dict[int, int]) -> dict[str, float]:
    total = sum(after[p] - before.get(p, 0) for p in after)
    main = after.get(root, 0) - before.get(root, 0)
    return {"total_s": total / CLK_TCK, "root_s": main / CLK_TCK, "descendants_s": (total - main) / CLK_TCK}


LUA = """
wrk.method = "POST"
wrk.body = [===[%(body)s]===]
wrk.headers["Content-Type"] = "application/json"
%(headers)s
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\\"requests\\":%%d,\\"duration_us\\":%%d,\\"p50_us\\":%%d,\\"p99_us\\":%%d,"
    .. "\\"mean_us\\":%%f,\\"max_us\\":%%d,"
    .. "\\"non2xx\\":%%d,\\"connect\\":%%d,\\"read\\":%%d,\\"write\\":%%d,\\"timeout\\":%%d}\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.mean, latency.max,
    e.status, e.connect, e.read, e.write, e.timeout))
end
"""


def wrk(server: Server, body: str, concurrency: int, seconds: int, script: Path) -> dict[str, Any]:
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in server.headers.items())
    script.write_text(LUA % {"body": body, "headers": headers})
    threads = min(2, concurrency)
    cmd = [
        "wrk",
        "-t",
        str(threads),
        "-c",
        str(concurrency),
        "-d",
        f"{seconds}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        server.url + server.path,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 30)
    for line in done.stdout.splitlines():
        if line.startswith("WRKJSON "):
            return json.loads(line[len("WRKJSON ") :])
    raise RuntimeError(f"wrk gave no result (code {done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")


def check_one(server: Server, body: str) -> None:
    import httpx

    answer = httpx.post(
        server.url + server.path,
        content=body,
        timeout=30,
        headers={"content-type": "application/json", **server.headers},
    )
    if answer.status_code != 200 or not {"predictions", "outputs"} & set(answer.json()):  # MLflow's, or v2's
        raise RuntimeError(f"{server.kind}: sample request gave {answer.status_code}: {answer.text[:300]}")


def measure(server: Server, body: str, levels: list[int], seconds: int, script: Path) -> list[dict[str, Any]]:
    check_one(server, body)
    rows = []
    for c in levels:
        wrk(server, body, c, WARMUP_S, script)
        before = tree_cpu(server.pid)
        result = wrk(server, body, c, seconds, script)
        after = tree_cpu(server.pid)
        cpu = cpu_delta(server.pid, before, after)
        errors = result["non2xx"] + result["connect"] + result["read"] + result["write"] + result["timeout"]
        ok = max(result["requests"] - result["non2xx"], 0)
        duration_s = result["duration_us"] / 1e6
        row = {
            "server": server.kind,
            "concurrency": c,
            "rps": result["requests"] / duration_s,
            "p50_ms": result["p50_us"] / 1000,
            "p99_ms": result["p99_us"] / 1000,
            "requests": result["requests"],
            "errors": errors,
            "non2xx": result["non2xx"],
            "cpu_s_per_1000": cpu["total_s"] / ok * 1000 if ok else None,
            "cpu_root_s_per_1000": cpu["root_s"] / ok * 1000 if ok else None,
            "cpu_descendants_s_per_1000": cpu["descendants_s"] / ok * 1000 if ok else None,
            "cpu_cores_busy": cpu["total_s"] / duration_s,
            "processes": len(after),
        }
        rows.append(row)
        log(
            f"  {server.kind:10s} c={c:<3d} {row['rps']:8.1f} rps  p50 {row['p50_ms']:7.2f} ms  "
            f"p99 {row['p99_ms']:7.2f} ms  errors {errors}  cpu/1000 {row['cpu_s_per_1000'] or float('nan'):.3f} s"
        )
    return rows
