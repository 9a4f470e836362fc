"""The autoscaler's targets, in the simulator: a tuning set and a held-out set, every row x policy.

    python -m benchmarks.autoscaler [--set tuning|held-out|both] [--warm-pool N] [--shed|--hold]
        [--ablate RULE|all] [--baselines FILE] [--plots DIR] [--fixed] [--quick] [--json] [--workers 2]

Sets (benchmarks/autoscaler_targets.py): the tuning set is seed 0 of the two Azure LLM traces
(benchmarks/traces, rescaled to 2,000 req/s: time compressed up to 6x, then shifted copies superposed)
and the synthetic spike, ramp, diurnal and on/off; the held-out set is seeds 1-5 of the synthetic ones
and of three shapes kept for it (bursty, sawtooth, flash). Profiles: cpu, io_agent, embedding.
Every run is preceded by 120 s at the trace's initial rate that is not counted.

tollfree runs with the shipped defaults: the endpoint sets only its SLO, ``shed_load`` is the config's
default (``--shed`` / ``--hold`` force it), and its replicas start from the gateway's default warm
pool of one standby refilled one at a time (``--warm-pool N``; 0 = cold starts like a pod). Baselines:
HPA, KPA and Ray Serve at their defaults, and kpa-user / ray-user with the per-replica target a user
would set (simulator/policies.py); HPA and KPA pods start cold, Ray replicas from
pre-started workers (simulator/baselines.py).

Targets: per row, no baseline dominates tollfree, and tollfree is near the limit (bad <= floor + 1 %
of the requests, replica-seconds <= 2x the clairvoyant bound, 1.5x on the median row); spike rows
>= 5x fewer bad than HPA; ramp rows at capacity < 60 s; the vertical axis within 20 % of the best
fixed target of a constant-load sweep after 3 cycles and steady. ``--ablate`` reruns tollfree with
each rule of the policy off (benchmarks/autoscaler_ablation.py), against the same baselines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks import autoscaler_targets as T
from benchmarks.autoscaler_ablation import ABLATIONS
from benchmarks.autoscaler_reach import reach
from benchmarks.autoscaler_report import print_ablation, print_rows, print_summary, summary
from benchmarks.autoscaler_runs import (
    PROFILES,
    SWEEP_SEEDS,
    VERTICAL_CYCLES,
    WARMUP_S,
    best_fixed,
    learn_one,
    load_trace,
    run_one,
    sweep_grid,
    sweep_one,
    tollfree_policy,
)
from benchmarks.autoscaler_targets import ALL_POLICIES, BASELINES
from benchmarks.common import Provenance
from serving.autoscaler.config import ScalingConfig
from simulator.engine import simulate
from simulator.policies import WARM_POOL, make_policy
from simulator.profiles import PRESETS


def row_keys(sets: list[str], held_out_seeds: int = 5) -> list[tuple[str, str, int, str]]:
    return [(s, t, seed, p) for s in sets for t, seed in T.SETS[s] if seed <= held_out_seeds for p in PROFILES]


def jobs_for(keys, policies, args, rule=None) -> list[tuple]:
    return [
        (t, seed, p, pol, args.quick, args.shed, args.warm_pool, rule) for _, t, seed, p in keys for pol in policies
    ]


def evaluate(keys, by: dict, args, mine_of=lambda k: k) -> dict:
    """Targets 1 and 2 per row, and the spike and ramp targets, on ``keys``; ``by`` maps
    (trace, seed, profile, policy) to a run."""
    rows = []
    for s, t, seed, p in keys:
        mine = by[mine_of((t, seed, p, "tollfree"))]
        baselines = {b: by[(t, seed, p, b)] for b in BASELINES}
        checks = T.row_checks(mine, baselines, reach(t, p, seed, args.quick))
        rows.append({"set": s, "trace": t, "seed": seed, "profile": p, "mine": mine, "baselines": baselines, **checks})
    kept = []
    for r in rows:
        if r["trace"] == "spike":
            ratio = T.spike_ratio(r["mine"], r["baselines"]["hpa"])
            kept.append(
                {
                    **_key(r),
                    "target": "spike: >= 5x fewer bad than HPA",
                    "ok": ratio >= T.SPIKE_RATIO,
                    "detail": f"{ratio:.1f}x ({r['mine']['bad']:,} vs {r['baselines']['hpa']['bad']:,})",
                }
            )
        if r["trace"] == "ramp":
            ttc = r["mine"]["time_to_capacity_s"]
            kept.append(
                {
                    **_key(r),
                    "target": "ramp: capacity < 60 s",
                    "ok": ttc is not None and ttc < T.RAMP_S,
                    "detail": f"{ttc} s",
                }
            )
    return {"rows": rows, "kept": kept}


def _key(r: dict) -> dict:
    return {k: r[k] for k in ("set", "trace", "seed", "profile")}


def vertical_checks(learned: list[dict], swept: list[dict], sets: list[str]) -> list[dict]:
    out = []
    for rec in learned:
        best = best_fixed(swept, rec["profile"])
        check = (
            {"ok": False, "detail": "no sweep point with <= 1 % bad"}
            if best is None
            else T.vertical_check(rec["targets"], best, VERTICAL_CYCLES)
        )
        s = "tuning" if rec["seed"] == 0 else "held-out"
        if s in sets:
            out.append(
                {
                    "set": s,
                    "trace": "constant",
                    "seed": rec["seed"],
                    "profile": rec["profile"],
                    "target": "vertical: within 20 % in 3 cycles, steady",
                    **check,
                }
            )
    return out


def learn_seeds(sets: list[str], quick: bool, held_out_seeds: int = 5) -> list[int]:
    seeds = [0] if "tuning" in sets else []
    return seeds + list(range(1, 2 if quick else held_out_seeds + 1)) * ("held-out" in sets)


def run_all(pool: ProcessPoolExecutor, jobs: list[tuple]) -> dict:
    return {
        (r["trace"], r["seed"], r["profile"], r["policy"], r["ablate"]): r for r in pool.map(run_one, jobs, chunksize=1)
    }


def baseline_runs(pool: ProcessPoolExecutor, keys, args) -> dict:
    """The baselines' runs: from ``--baselines FILE`` (a previous ``--json`` output) where it has them."""
    have: dict = {}
    if args.baselines:
        for r in json.loads(Path(args.baselines).read_text())["runs"]:
            if r["policy"] != "tollfree" and r.get("quick", False) == args.quick:
                have[(r["trace"], r["seed"], r["profile"], r["policy"])] = r
    missing = [j for j in jobs_for(keys, BASELINES, args) if (j[0], j[1], j[2], j[3]) not in have]
    for k, r in run_all(pool, missing).items():
        have[k[:4]] = r
    return have


def ablation(pool, keys, by: dict, swept: list[dict], sets: list[str], rules: list[str | None], args) -> list[dict]:
    """Per rule (None: as shipped) and set: the tally with that rule off."""
    seeds = learn_seeds(sets, args.quick, args.held_out_seeds)
    seconds = 300.0 if args.quick else 600.0
    out = []
    for rule in rules:
        runs = run_all(pool, jobs_for(keys, ("tollfree",), args, rule))
        learned = list(
            pool.map(learn_one, [(p, s, seconds, args.shed, args.warm_pool, rule) for p in PROFILES for s in seeds])
        )
        merged = dict(by)
        merged.update({k[:4]: r for k, r in runs.items()})
        ev = evaluate(keys, merged, args)
        vertical = vertical_checks(learned, swept, sets)
        for s in sets:
            out.append({"rule": rule or "(none: as shipped)", **summary(ev, s, vertical)})
        print(f"  ablation: {rule or 'as shipped'} done", file=sys.stderr)
    return out


def plots(ev: dict, out_dir: Path, args) -> list[str]:
    """PNGs of the three rows where tollfree wins most and the three where it loses most."""
    from simulator.plot import plot

    best, worst = T.extremes(ev["rows"])
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, rows in (("wins", best), ("loses", worst)):
        for i, r in enumerate(rows, 1):
            profile = PRESETS[r["profile"]]
            trace = load_trace(r["trace"], r["seed"], args.quick)
            results = {}
            for name in ALL_POLICIES:
                policy = (
                    tollfree_policy(r["profile"], args.shed, args.warm_pool)
                    if name == "tollfree"
                    else make_policy(name, profile)
                )
                res = simulate(trace, profile, policy, seed=r["seed"], timeline=True, warmup_s=WARMUP_S)
                res.timeline["slo_ms"] = profile.slo_ms
                results[name] = res
            path = out_dir / f"autoscaler-{kind}-{i}-{r['trace']}-s{r['seed']}-{r['profile']}.png"
            plot(results, path, title=f"{r['trace']} seed {r['seed']} x {r['profile']} (tollfree {kind} most, #{i})")
            written.append(str(path))
    return written


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.autoscaler")
    ap.add_argument("--set", choices=("tuning", "held-out", "both"), default="both")
    ap.add_argument(
        "--warm-pool",
        type=float,
        default=WARM_POOL,
        help=f"tollfree's standbys (default {WARM_POOL}, the gateway's; 0: cold; inf: unlimited)",
    )
    shed = ap.add_mutually_exclusive_group()
    shed.add_argument("--shed", dest="shed", action="store_const", const=True, help="shed_load true")
    shed.add_argument("--hold", dest="shed", action="store_const", const=False, help="shed_load false")
    ap.add_argument("--ablate", metavar="RULE|all", help=f"rerun tollfree with a rule off: {', '.join(ABLATIONS)}")
    ap.add_argument("--baselines", metavar="FILE", help="reuse the baselines' runs of a previous --json output")
    ap.add_argument("--plots", metavar="DIR", help="PNGs of the 3 rows tollfree wins most and the 3 it loses most")
    ap.add_argument(
        "--held-out-seeds",
        type=int,
        default=5,
        choices=range(1, 6),
        metavar="1-5",
        help="the held-out set's seeds 1..N (default 5; the ablation's table uses fewer to fit in time)",
    )
    ap.add_argument("--quick", action="store_true", help="shorter traces (a smoke run)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    if args.warm_pool < 0 or (args.warm_pool != math.inf and args.warm_pool != int(args.warm_pool)):
        ap.error("--warm-pool must be a whole number >= 0, or inf")
    if args.ablate and args.ablate != "all" and args.ablate not in ABLATIONS:
        ap.error(f"--ablate: unknown rule {args.ablate!r}; choose from {', '.join(ABLATIONS)} or all")
    return args


def simulate_all(args: argparse.Namespace, sets: list[str], keys: list) -> dict:
    """Every run the targets need, on ``args.workers`` processes: each row x policy, the constant-load sweep and
    what tollfree's vertical axis learns, then the ablation's reruns if asked."""
    seconds = 300.0 if args.quick else 600.0
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        by = baseline_runs(pool, keys, args)
        mine = run_all(pool, jobs_for(keys, ("tollfree",), args))
        by.update({k[:4]: r for k, r in mine.items()})
        sweeps = [(p, t, k, seconds, args.shed) for p in PROFILES for t in sweep_grid(p) for k in range(SWEEP_SEEDS)]
        swept = list(pool.map(sweep_one, sweeps))
        seeds = learn_seeds(sets, args.quick, args.held_out_seeds)
        learned = list(
            pool.map(learn_one, [(p, s, seconds, args.shed, args.warm_pool, None) for p in PROFILES for s in seeds])
        )
        ev = evaluate(keys, by, args)
        vertical = vertical_checks(learned, swept, sets)
        rules = [None, *ABLATIONS] if args.ablate == "all" else ([args.ablate] if args.ablate else [])
        table = ablation(pool, keys, by, swept, sets, rules, args) if rules else []
    return {"by": by, "ev": ev, "vertical": vertical, "learned": learned, "ablation": table}


def print_text(done: dict, sets: list[str], args: argparse.Namespace) -> None:
    """The rows of each set, the targets, what the vertical axis learned, the ablation's table, the plots."""
    ev, vertical, learned = done["ev"], done["vertical"], done["learned"]
    for s in sets:
        print_rows(ev, s)
    print_summary(ev, vertical, sets)
    for p in PROFILES:
        seeds = (f"seed {x['seed']}: {[t for _, t in x['targets']][:6]}" for x in learned if x["profile"] == p)
        print(f"  learned {p}: " + "; ".join(seeds))
    if done["ablation"]:
        print_ablation(done["ablation"])
    for p in done["plots"]:
        print(f"plot: {p}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    provenance = Provenance("benchmarks.autoscaler", argv)
    sets = ["tuning", "held-out"] if args.set == "both" else [args.set]
    keys = row_keys(sets, args.held_out_seeds)
    shed_used = ScalingConfig().shed_load if args.shed is None else args.shed
    print(
        f"{len(keys)} rows x {len(ALL_POLICIES)} policies, {args.workers} workers; tollfree: shed_load "
        f"{str(shed_used).lower()}, warm pool {args.warm_pool:g} ...",
        file=sys.stderr,
    )
    done = simulate_all(args, sets, keys)
    ev, vertical = done["ev"], done["vertical"]
    done["plots"] = plots(ev, Path(args.plots), args) if args.plots else []
    record = provenance.record()
    if args.json:
        report = {
            **record,
            "shed_load": shed_used,
            "warm_pool": args.warm_pool,
            "workers": args.workers,
            "sets": sets,
            "runs": [dict(r, quick=args.quick) for r in done["by"].values()],
            "rows": [{k: v for k, v in r.items() if k not in ("mine", "baselines")} for r in ev["rows"]],
            "kept": ev["kept"],
            "vertical": vertical,
            "learned": done["learned"],
            "summary": [summary(ev, s, vertical) for s in sets],
            "ablation": done["ablation"],
            "plots": done["plots"],
        }
        print(json.dumps(report, indent=1, default=str))
        return 0
    print_text(done, sets, args)
    print(
        f"tollfree: shed_load {str(shed_used).lower()}, warm pool {args.warm_pool:g}; {record['seconds']:.0f} s wall, "
        f"{args.workers} workers, load average {record['loadavg_after'][0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
