"""The fidelity benchmark's text output: a scenario's comparison, profile and replica timelines; the summary."""

from __future__ import annotations

import json
from typing import Any


def cell(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(report: dict[str, Any]) -> str:
    """One scenario's comparison, its profile and the replica timelines (changes only) as text."""
    p, m, tl = report["profile"], report["measured"], report["timelines"]
    rounded = json.dumps(
        {k: round(p[k], 3) for k in ("service_ms", "service_sigma", "model_load_s", "warm_start_s", "cold_start_s")}
        | {k: m[k] for k in ("starts", "refills_s")}
    )
    lines = [
        f"{report['scenario']} ({report['settings']}): {'PASS' if report['passed'] else 'FAIL'}; "
        f"{report['requests']} requests {report['statuses']}; load {report['loadavg']}; "
        f"warm/cold starts {report['warm_starts']}/{report['cold_starts']}; shift {report['shift_s']:.2f} s",
        f"  profile and starts measured: {rounded}",
        f"  {'metric':<22}{'live':>9}{'sim':>9}{'gap':>8}",
    ]
    for row in report["compare"]:
        lines.append(
            f"  {row['metric']:<22}{cell(row['live']):>9}{cell(row['sim']):>9}"
            f"{cell(row['gap'], '{:+.0%}'):>8} {row['verdict']}".rstrip()
        )
    rows = list(zip(tl["live"]["t"], *(tl[k][f] for k in ("live", "sim") for f in ("ready", "provisioned"))))
    changes = [
        f"{r[0]:.1f}s {r[1]}/{r[2]} {r[3]}/{r[4]}" for i, r in enumerate(rows) if not i or r[1:] != rows[i - 1][1:]
    ]
    timeline = (
        f"  ready/provisioned live sim (step {report['step_at']:.1f} s, load ends {report['load_end']:.1f} s): "
        + "; ".join(changes)
    )
    return "\n".join([*lines, timeline])


def summary_line(report: dict[str, Any]) -> str:
    """The scenario's verdict and its judged gaps, the rows with a verdict (bad: with both counts)."""
    rows = {row["metric"]: row for row in report["compare"] if row["verdict"]}
    return f"  {report['scenario']:<28}{'PASS' if report['passed'] else 'FAIL':<6}" + "  ".join(
        f"{key} {cell(row['gap'], '{:+.0%}')}"
        + (f" ({row['live']} vs {row['sim']})" if key == "bad" else "")
        + ("" if row["verdict"] == "PASS" else " FAIL")
        for key, row in rows.items()
    )
