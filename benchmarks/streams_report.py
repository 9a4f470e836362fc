"""The stream benchmark's targets, their verdicts, and the table it prints (markdown, as
docs/benchmarks/streams.md shows it)."""

from __future__ import annotations

import math
from typing import Any

from benchmarks.streams_stack import ROLES

P99_MS, RATIO, RECOVERY_S = 50.0, 5.0, 60.0


def verdicts(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The three targets, PASS/FAIL with the figure; "bounded" lag: never a second of events behind."""
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
            "figure": f"p99 {s['p99_ms']} ms (p50 {s['p50_ms']}, max {s['max_ms']}), "
            f"max lag {s['max_lag']} at {s['rate']}/s",
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
