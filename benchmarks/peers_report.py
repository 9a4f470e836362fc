"""The peers benchmark's verdict against its targets and its markdown table (benchmarks/peers.py)."""

from __future__ import annotations

from typing import Any

OURS = ("tollfree", "tollfree-example", "tollfree-fixed", "mlflow-2w")  # never a peer in the verdict
CEILING = "uvicorn"  # the bare ASGI app: no model
TARGETS = {
    "rps_c32_over_best_peer": 2.0,
    "p50_c1_over_best_peer": 1.2,
    "rows_per_s_32_over_best_peer": 2.0,
    "p99_c32_over_that_peer": 1.0,
    "p50_c1_over_in_process_ms": 1.0,
}
PASS_WHEN = {
    "rps_c32_over_best_peer": ">=",
    "p50_c1_over_best_peer": "<=",
    "rows_per_s_32_over_best_peer": ">=",
    "p99_c32_over_that_peer": "<",
    "p50_c1_over_in_process_ms": "<=",
}


_MEDIAN_KEYS = ("rps", "rows_per_s", "p50_ms", "p99_ms", "cpu_s_per_1000_predictions")


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per server, rows and c: the median of its rounds (``--repeat``) for each figure, the errors summed,
    and ``rps_range`` (the rounds' lowest and highest rps) when there was more than one round. In first-seen order."""
    groups: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["rows"], r["concurrency"]), []).append(r)
    out = []
    for (server, n, c), rounds in groups.items():
        row: dict[str, Any] = {
            "server": server,
            "rows": n,
            "concurrency": c,
            "rounds": len(rounds),
            "errors": sum(r["errors"] for r in rounds),
        }
        for key in _MEDIAN_KEYS:
            values = sorted(r[key] for r in rounds if r[key] is not None)
            row[key] = None if not values else (values[(len(values) - 1) // 2] + values[len(values) // 2]) / 2
        if len(rounds) > 1:
            row["rps_range"] = [min(r["rps"] for r in rounds), max(r["rps"] for r in rounds)]
        if any(r.get("replicas_asked") is not None for r in rounds):
            row["replicas_asked_rounds"] = [r.get("replicas_asked") for r in rounds]
        out.append(row)
    return out


def verdict(rows: list[dict[str, Any]], in_process_ms: float | None = None) -> dict[str, Any]:
    """tollfree (shipped defaults) against the best peer at each target's point; ``in_process_ms``: the
    model's own predict of one row in the benchmark's process (p50), for the c=1 overhead target."""

    def best_peer(n: int, c: int, key: str, low: bool = False) -> dict[str, Any] | None:
        peers = [
            r
            for r in rows
            if r["rows"] == n
            and r["concurrency"] == c
            and r["server"] not in OURS
            and r["server"] != CEILING
            and r["errors"] == 0
        ]
        return (min if low else max)(peers, key=lambda r: r[key]) if peers else None

    def ours(n: int, c: int) -> dict[str, Any] | None:
        return next((r for r in rows if r["server"] == "tollfree" and r["rows"] == n and r["concurrency"] == c), None)

    out: dict[str, Any] = {}
    checks = [
        ("rps_c32_over_best_peer", 1, 32, "rps", False),
        ("p50_c1_over_best_peer", 1, 1, "p50_ms", True),
        ("rows_per_s_32_over_best_peer", 32, 32, "rows_per_s", False),
    ]
    for name, n, c, key, low in checks:
        mine, peer = ours(n, c), best_peer(n, c, key, low)
        if mine and peer:
            ratio = mine[key] / peer[key]
            ok = ratio <= TARGETS[name] if low else ratio >= TARGETS[name]
            out[name] = {"value": round(ratio, 2), "best_peer": peer["server"], "target": TARGETS[name], "pass": ok}
    mine, peer = ours(1, 32), best_peer(1, 32, "rps")
    if mine and peer:  # the throughput lead must not come from a longer tail than that peer's
        ratio = mine["p99_ms"] / peer["p99_ms"]
        out["p99_c32_over_that_peer"] = {
            "value": round(ratio, 2),
            "best_peer": peer["server"],
            "target": TARGETS["p99_c32_over_that_peer"],
            "pass": ratio < 1.0,
        }
    mine = ours(1, 1)
    if mine and in_process_ms is not None:
        over = mine["p50_ms"] - in_process_ms
        out["p50_c1_over_in_process_ms"] = {
            "value": round(over, 2),
            "best_peer": f"in-process {in_process_ms:.2f} ms",
            "target": TARGETS["p50_c1_over_in_process_ms"],
            "pass": over <= 1.0,
        }
    return out


def scaling_text(decisions: list[dict[str, Any]]) -> str:
    """What tollfree's autoscaler did over a server's run: the most replicas it asked for, its last per-replica
    limit, and how often it held the replicas at the machine's busy cores."""
    if not decisions:
        return "; autoscaler: no decision"
    held = sum("cores are busy" in d["reason"] for d in decisions)
    return (
        f"; autoscaler: up to {max(d['replicas'] for d in decisions)} replica(s), "
        f"limit {decisions[-1]['max_concurrency']} per replica at the end"
        + (f", held at the cores in {held} decision(s)" if held else "")
    )


_DECISION_INPUTS = ("load_up", "load_down", "target", "service_s", "forecast", "lead_s", "cores_busy")


def attach_decisions(rows: list[dict[str, Any]], decisions: list[dict[str, Any]]) -> None:
    """Each measured point (``row["window"]``: its monotonic start, warm-up included, and end) gets the autoscaler
    decisions taken during it, each with its time into the point, the replicas asked for, the reason and the
    inputs the horizontal axis read, and ``replicas_asked``: the most replicas asked for during the point."""
    for row in rows:
        start, end = row.pop("window")
        during = [d for d in decisions if start <= d["t"] <= end]
        row["decisions"] = [
            {
                "s": round(d["t"] - start, 2),
                "replicas": d["replicas"],
                "ready": d["ready_replicas"],
                "reason": d["reason"],
                **{k: d["inputs"][k] for k in _DECISION_INPUTS if k in d["inputs"]},
            }
            for d in during
        ]
        row["replicas_asked"] = max((d["replicas"] for d in during), default=None)


def table(rows: list[dict[str, Any]], info: dict[str, dict[str, Any]]) -> str:
    ceiling = {(r["rows"], r["concurrency"]): r["rps"] for r in rows if r["server"] == CEILING}
    lines = [
        "| server | path | rows | c | rps | rows/s | p50 ms | p99 ms | errors | CPU-s / 1000 preds | x ceiling rps | "
        "replicas asked (each round) | load 1m before/after |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        top = ceiling.get((r["rows"], r["concurrency"]))
        share = "-" if not top else f"{r['rps'] / top:.2f}"
        cpu = r["cpu_s_per_1000_predictions"]
        cpu_text = "-" if cpu is None else f"{cpu:.3f}"
        load = info.get(r["server"], {}).get("loadavg_1m_before_after", ["-", "-"])
        spread = f" ({r['rps_range'][0]:.0f}-{r['rps_range'][1]:.0f})" if r.get("rps_range") else ""
        asked = r.get("replicas_asked_rounds") or ([r["replicas_asked"]] if r.get("replicas_asked") is not None else [])
        asked_text = "/".join("-" if a is None else str(a) for a in asked) or "-"
        lines.append(
            f"| {r['server']} | {info.get(r['server'], {}).get('path') or '-'} | {r['rows']} | {r['concurrency']} | "
            f"{r['rps']:.1f}{spread} | {r['rows_per_s']:.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['errors']} | "
            f"{cpu_text} | {share} | {asked_text} | {load[0]}/{load[1]} |"
        )
    return "\n".join(lines)


def render(result: dict[str, Any], warmup_s: float) -> str:
    """The whole run as text: its command, date, machine and versions, then each model's table and verdict."""
    tools = result["versions"]
    load = [result["loadavg_before"][0], result["loadavg_after"][0]]
    out = [
        f"{result['command']}\n{result['date']} at {result['commit']}; {tools['wrk']}; python {result['python']}, "
        f"mlflow {tools['mlflow']}, sklearn {tools['sklearn']}; {result['cpus']} cpus shared by wrk and the server; "
        f"{warmup_s} s warm-up + {result['seconds_per_point']} s per point; {result['seconds']} s in all; "
        f"1-min load average before/after {load}"
    ]
    out += [f"{kind}: {', '.join(f'{k} {x}' for k, x in v.items())}" for kind, v in result["peer_versions"].items()]
    for key, res in result["results"].items():
        out += [f"\n## {key}: {res['label']}\n", table(res["rows"], res["servers"]), ""]
        out += [
            f"{name}: {v['value']} against {v['best_peer']} (target {PASS_WHEN[name]} {v['target']}): "
            f"{'PASS' if v['pass'] else 'FAIL'}"
            for name, v in res["verdict"].items()
        ]
        out += [f"FAILED {kind}: {why}" for kind, why in res["failures"].items()]
    return "\n".join(out)
