"""What the autoscaler benchmark (benchmarks/autoscaler.py) reports: a set's tally, and the tables it prints
without ``--json`` (the rows, the targets per set, the ablation)."""

from __future__ import annotations

import math

from benchmarks import autoscaler_targets as T
from benchmarks.autoscaler_targets import BASELINES


def summary(ev: dict, set_name: str, vertical: list[dict]) -> dict:
    """One set's tally: rows meeting targets 1 and 2, the median ratio, the kept targets met."""
    rows = [r for r in ev["rows"] if r["set"] == set_name]
    kept = [k for k in ev["kept"] if k["set"] == set_name] + [v for v in vertical if v["set"] == set_name]
    return {
        "set": set_name,
        "rows": len(rows),
        "pareto": sum(not r["dominated_by"] for r in rows),
        "near": sum(r["ok"] for r in rows),
        "median_rs_ratio": T.median_ratio(rows) if rows else math.nan,
        "median_ok": bool(rows) and T.median_ratio(rows) <= T.RS_RATIO_MEDIAN,
        "kept": sum(k["ok"] for k in kept),
        "kept_of": len(kept),
        "bad": sum(r["mine"]["bad"] for r in rows),
        "replica_seconds": sum(r["mine"]["replica_seconds"] for r in rows),
        "model": T.model_targets(rows) if rows and all(r.get("start_bad") is not None for r in rows) else None,
    }


def print_rows(ev: dict, set_name: str) -> None:
    print(
        f"\n{set_name} set: per row, tollfree's replica-s / bad, each baseline's (D: it dominates tollfree), "
        f"the floor (bad whatever the capacity), the start floor (+ what replica starts leave unanswered), "
        f"the bound, and tollfree's distances to them"
    )
    print(
        f"{'trace':<10} {'seed':>4} {'profile':<9} {'tollfree':>16}  "
        + "  ".join(f"{b:>16}" for b in BASELINES)
        + f"  {'floor':>7} {'start':>7} {'bound':>8} {'+bad %':>7} {'+start %':>8} {'rs/bound':>8}  targets"
    )

    def cell(x: dict) -> str:
        return f"{x['replica_seconds']:,.0f}/{x['bad']:,}"

    for r in ev["rows"]:
        if r["set"] != set_name:
            continue
        bs = "  ".join(f"{(('D ' if b in r['dominated_by'] else '') + cell(r['baselines'][b])):>16}" for b in BASELINES)
        verdict = ("ok" if not r["dominated_by"] else "DOMINATED") + (" near" if r["ok"] else " FAR")
        print(
            f"{r['trace']:<10} {r['seed']:>4} {r['profile']:<9} {cell(r['mine']):>16}  {bs}  {r['floor_bad']:>7,} "
            f"{r['start_bad']:>7,} {r['bound_rs']:>8,.0f} {100 * r['extra_bad_share']:>7.2f} "
            f"{100 * r['extra_over_start']:>8.2f} {r['rs_ratio']:>8.2f}  {verdict}"
        )


def print_summary(ev: dict, vertical: list[dict], sets: list[str]) -> None:
    for s in sets:
        t = summary(ev, s, vertical)
        print(
            f"\n{s}: {t['rows']} rows; not dominated {t['pareto']}/{t['rows']}; "
            f"near the limit {t['near']}/{t['rows']}; median replica-s / bound {t['median_rs_ratio']:.2f} "
            f"({'PASS' if t['median_ok'] else 'FAIL'}, <= 1.5); "
            f"kept targets {t['kept']}/{t['kept_of']}"
        )
        m = t["model"]
        if m is not None:
            print(
                f"  the model's targets: not dominated {m['not_dominated']}/{m['rows']}; bad <= start floor + 1 % "
                f"{m['within_start_floor']}/{m['rows']}; replica-s / bound median {m['median_rs_ratio']:.2f} "
                f"({'PASS' if m['median_ok'] else 'FAIL'}, <= 1.5), max {m['max_rs_ratio']:.2f} "
                f"({'PASS' if m['max_ok'] else 'FAIL'}, <= 2.5); beyond the anchors on steps and bursts "
                f"{m['beyond_anchors']}/{m['stepped']}"
            )
        for c in [k for k in ev["kept"] + vertical if k["set"] == s]:
            print(
                f"  {'PASS' if c['ok'] else 'FAIL'}  {c['target']:<44} {c['trace']:<9} {c['seed']:>2} "
                f"{c['profile']:<10} {c['detail']}"
            )
        for r in ev["rows"]:
            if r["set"] == s and r["out_of_reach"]:
                print(
                    f"  out of reach of any policy with the scale-down window: {r['trace']} {r['seed']} "
                    f"{r['profile']}: {', '.join(r['out_of_reach'])} (at the floor {r['floor_bad']:,} under the "
                    f"bound {r['bound_rs']:,.0f})"
                )


def print_ablation(table: list[dict]) -> None:
    print("\nablation (each rule off; tollfree's totals over the set's rows):")
    print(
        f"{'rule off':<20} {'set':<9} {'not dom.':>8} {'near':>6} {'median':>7} {'kept':>6} {'bad':>11} "
        f"{'replica-s':>11}"
    )
    for a in table:
        print(
            f"{a['rule']:<20} {a['set']:<9} {a['pareto']:>4}/{a['rows']:<3} {a['near']:>3}/{a['rows']:<3} "
            f"{a['median_rs_ratio']:>7.2f} {a['kept']:>3}/{a['kept_of']:<2} {a['bad']:>11,} "
            f"{a['replica_seconds']:>11,.0f}"
        )
