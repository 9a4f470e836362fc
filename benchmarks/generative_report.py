"""The generative benchmark's figures per run (the clients' results merged), its targets, verdicts and table."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from benchmarks.common import percentile

TTFT_MS, ITL_MS, PROXY_TOKENS_S, TARGET_STREAMS = 5.0, 2.0, 20_000, 500


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


def per_token_us(cpu_s: dict[str, float], tokens: float) -> dict[str, float | None]:
    """CPU microseconds per token delivered, per role (None without tokens)."""
    return {role: round(s / tokens * 1e6, 1) if tokens else None for role, s in cpu_s.items()}


def verdicts(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The targets on the runs of ``n`` streams: the gateway's added p99 TTFT and ITL (b - a), no stream
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
