"""The batch benchmark's rows, its targets and their verdicts, and the table it prints."""

from __future__ import annotations

from typing import Any

ENTITY_KEYS = "tollfree (local, entity keys)"
FEATURES_GIVEN = "tollfree (local, features given)"
NAIVE = "naive pandas script"
MLFLOW = "mlflow models predict"
LIMIT = "limit (read + predict on every core + write)"
TARGETS = {"vs_mlflow": 5.0, "vs_naive": 1.0, "rss_10m_over_1m": 1.5, "over_limit": 2.0}


def result_row(tool: str, rows: int, m: dict[str, Any], work_s: float | None, scored: int) -> dict[str, Any]:
    """A result row from one measurement ``m`` (``batch_measure.measure``) and the tool's own work seconds."""
    return {
        "tool": tool,
        "rows": rows,
        "scored": scored,
        "wall_s": round(m["wall"], 2),
        "rows_per_s": round(rows / m["wall"]),
        "work_s": round(work_s, 2) if work_s else None,
        "work_rows_per_s": round(rows / work_s) if work_s else None,
        "peak_rss_mb": round(m["maxrss_mb"]),
        "tree_peak_mb": round(m["tree_peak_mb"]),
    }


def verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def pick(tool: str, rows: int) -> dict[str, Any] | None:
        return next((r for r in results if r["tool"] == tool and r["rows"] == rows and "error" not in r), None)

    out = []
    mlflow = [r for r in results if r["tool"] == MLFLOW and "error" not in r]
    if mlflow:
        best = max(mlflow, key=lambda r: r["rows"])
        for r in sorted((r for r in results if r["tool"] == FEATURES_GIVEN), key=lambda r: r["rows"]):
            for key in ("rows_per_s", "work_rows_per_s"):
                if r.get(key) and best.get(key):
                    ratio = r[key] / best[key]
                    out.append(
                        {
                            "target": f"{FEATURES_GIVEN} {key} vs {MLFLOW} ({best['rows']} rows)",
                            "rows": r["rows"],
                            "ratio": round(ratio, 2),
                            "need": TARGETS["vs_mlflow"],
                            "pass": ratio >= TARGETS["vs_mlflow"],
                        }
                    )
    for r in (r for r in results if r["tool"] == FEATURES_GIVEN and r.get("work_s")):
        bound = pick(LIMIT, r["rows"])
        if bound and bound.get("work_s"):
            ratio = r["work_s"] / bound["work_s"]
            out.append(
                {
                    "target": f"{FEATURES_GIVEN} work s over the {LIMIT}",
                    "rows": r["rows"],
                    "ratio": round(ratio, 2),
                    "need": f"<= {TARGETS['over_limit']}",
                    "pass": ratio <= TARGETS["over_limit"],
                }
            )
    ours = {r["rows"]: r for r in results if r["tool"] == ENTITY_KEYS}
    for rows, r in sorted(ours.items()):
        n = pick(NAIVE, rows)
        failed = next((x for x in results if x["tool"] == NAIVE and x["rows"] == rows and "error" in x), None)
        if failed:
            out.append(
                {
                    "target": f"{ENTITY_KEYS} rows_per_s vs {NAIVE}",
                    "rows": rows,
                    "ratio": "naive did not finish",
                    "need": TARGETS["vs_naive"],
                    "pass": True,
                    "note": failed["error"],
                }
            )
        if n:
            ratio = r["rows_per_s"] / n["rows_per_s"]
            out.append(
                {
                    "target": f"{ENTITY_KEYS} rows_per_s vs {NAIVE}",
                    "rows": rows,
                    "ratio": round(ratio, 2),
                    "need": TARGETS["vs_naive"],
                    "pass": ratio >= TARGETS["vs_naive"],
                }
            )
    for tool in (ENTITY_KEYS, FEATURES_GIVEN):
        mine = {r["rows"]: r for r in results if r["tool"] == tool}
        if 1_000_000 in mine and 10_000_000 in mine:
            ratio = mine[10_000_000]["peak_rss_mb"] / mine[1_000_000]["peak_rss_mb"]
            out.append(
                {
                    "target": f"{tool} peak RSS 10M / 1M",
                    "rows": 10_000_000,
                    "ratio": round(ratio, 2),
                    "need": f"<= {TARGETS['rss_10m_over_1m']}",
                    "pass": ratio <= TARGETS["rss_10m_over_1m"],
                }
            )
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        f"{'tool':34} {'rows':>10} {'wall s':>8} {'rows/s':>9} {'work s':>8} {'work rows/s':>11} {'peak RSS MB':>11} "
        f"{'tree RSS MB':>11}"
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"{r['tool']:34} {r['rows']:>10} failed: {r['error'][:120]}")
            continue
        lines.append(
            f"{r['tool']:34} {r['rows']:>10} {r['wall_s']:>8.1f} {r['rows_per_s']:>9} "
            f"{r['work_s'] if r['work_s'] is not None else '-':>8} {r['work_rows_per_s'] or '-':>11} "
            f"{r['peak_rss_mb']:>11} {r['tree_peak_mb']:>11}"
        )
    lines.append("")
    for r in report["results"]:
        if r.get("stage_seconds"):
            stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stage_seconds"].items())
            lines.append(
                f"{r['tool']} {r['rows']} rows, chunks of {r.get('chunk_rows') or '-'}: stage seconds {stages}"
            )
    if "loadavg_after" in report:
        lines.append(f"load average at the end: {' '.join(f'{x:.1f}' for x in report['loadavg_after'])}")
    lines.append("")
    for v in report["verdicts"]:
        lines.append(
            f"{'PASS' if v['pass'] else 'FAIL'}  {v['target']} at {v['rows']} rows: {v['ratio']} (need {v['need']})"
        )
    return "\n".join(lines)
