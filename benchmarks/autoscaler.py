"""The autoscaler's targets, in the simulator: every trace x profile x policy in one table.

    python -m benchmarks.autoscaler [--json] [--quick] [--workers 2] [--seed 0] [--hold]

Traces: the two Azure LLM traces (../shared/traces) rescaled to a mean of 2,000 req/s (time
compressed 6x -- an hour becomes ~10 min -- then shifted copies superposed, shifts up to 2 s, so
bursts and gaps keep their shape), and the synthetic spike (10x within 5 s), ramp (10 -> 10,000 QPS
in 30 s), diurnal (a day in 20 min) and on/off bursts. Profiles: cpu, io_agent, embedding (presets in
serving/autoscaler/simulate/profiles.py, 10 s model load each). Policies: tollfree (warm pool; its
endpoint sets ``shed_load: true``, so the gateway refuses at once what cannot be answered within the
SLO, as the live gateway does with that setting; ``--hold`` runs it with the default, false, where the
gateway holds up to ``max_queue`` for at most 5 s each), HPA, KPA and Ray Serve at the defaults the issue names, and kpa-user / ray-user, the same systems with the
per-replica target a user would set for the profile (see policies.py). Every run is preceded by 120 s
at the trace's initial rate that is not counted (all policies settle; tollfree learns its target).

Targets checked (the issue's):
  beats        vs every baseline: fewer bad requests (over the SLO or rejected) at no more
               replica-seconds, or >= 30 % fewer replica-seconds at no more bad requests
  spike 5x     spike: tollfree's bad requests <= HPA's / 5
  ramp < 60 s  ramp: ready capacity for 10,000 QPS within 60 s of the ramp's start
  vertical     constant load per profile: the learned target after 3 vertical cycles (90 s) is within
               20 % of the best fixed target of a sweep (fewest replica-seconds with <= 1 % bad
               requests, both as means over 3 seeds), and every later target stays within
               20 % of it

For every row not beaten, the benchmark also prints its reach (:func:`reach`): the trace's floor of bad
requests, and a lower bound on the replica-seconds of any policy that keeps tollfree's scale-down window,
with the baselines that no such policy can beat. ``--fixed`` adds, for each such row, tollfree's own
horizontal axis at every fixed target of the vertical sweep's grid and the user's target, with the gateway
shedding and holding (:func:`fixed_targets`): whether any one target would beat every baseline there,
and the nearest.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from functools import lru_cache

import numpy as np
import pandas as pd

from serving.autoscaler.simulate import traces as tr
from serving.autoscaler.simulate.engine import TAIL_S, service_times, simulate, with_warmup
from serving.autoscaler.simulate.policies import POLICIES, USER_VARIANTS, Tollfree, make_policy, tollfree_config
from serving.autoscaler.simulate.profiles import PRESETS

TRACES = ("azure_code", "azure_conv", "spike", "ramp", "diurnal", "onoff")
PROFILES = ("cpu", "io_agent", "embedding")
ALL_POLICIES = POLICIES + USER_VARIANTS
BASELINES = tuple(p for p in ALL_POLICIES if p != "tollfree")
WARMUP_S = 120.0
REAL_MEAN_RPS = 2000.0
CONSTANT_RPS = {"cpu": 1000.0, "io_agent": 2000.0, "embedding": 2000.0}
VERTICAL_CYCLES = 3
# The sweep's replica-seconds differ by 1-2 % between seeds (io_agent at 281.6 / 320 / 384: 9,381 /
# 9,358 / 9,281 with seed 0, 9,156 / 9,343 / 9,309 with seed 1, 9,032 / 9,319 / 9,305 with seed 2), as
# much as neighbouring targets differ: one seed picks its "best" by noise, so the sweep averages three.
SWEEP_SEEDS = 3


@lru_cache(maxsize=8)
def load_trace(name: str, seed: int, quick: bool) -> tr.Trace:
    if name.startswith("azure_"):
        path = tr.SHARED_TRACES / f"azure_llm_2023_{name.split('_', 1)[1]}.csv"
        trace = tr.load_csv(path).scale_to(REAL_MEAN_RPS, seed=seed)
        if quick:
            trace = replace(trace, arrivals=trace.arrivals[trace.arrivals < 180.0])
        return trace
    gen = tr.SYNTHETIC[name]
    if quick and name == "diurnal":
        return gen(seed=seed, day_s=300.0)
    if quick and name == "onoff":
        return gen(seed=seed, cycles=2)
    return gen(seed=seed)


def constant(rps: float, seconds: float, seed: int) -> tr.Trace:
    return tr.from_rate("constant", lambda t: np.full_like(t, rps), seconds, seed)


def run_one(job: tuple) -> dict:
    trace_name, profile_name, policy_name, seed, quick, shed = job
    profile = PRESETS[profile_name]
    t0 = time.perf_counter()
    extra = {"shed_load": shed} if policy_name == "tollfree" else {}
    result = simulate(load_trace(trace_name, seed, quick), profile, make_policy(policy_name, profile, **extra),
                      seed=seed, timeline=False, warmup_s=WARMUP_S)
    out = result.summary()
    out.update(trace=trace_name, profile=profile_name, policy=policy_name, bad=result.bad,
               wall_s=round(time.perf_counter() - t0, 2))
    return out


def sweep_one(job: tuple) -> dict:
    profile_name, target, seed, seconds, shed = job
    profile = PRESETS[profile_name]
    policy = Tollfree(tollfree_config(profile, vertical=False, initial_target=target, min_target=min(1.0, target),
                                      max_target=max(1024.0, target), shed_load=shed))
    r = simulate(constant(CONSTANT_RPS[profile_name], seconds, seed), profile, policy, seed=seed, timeline=False,
                 warmup_s=WARMUP_S)
    return {"profile": profile_name, "target": target, "replica_seconds": r.replica_seconds,
            "bad_share": r.bad / r.requests}


def learn_one(job: tuple) -> dict:
    profile_name, seed, seconds, shed = job
    profile = PRESETS[profile_name]
    policy = make_policy("tollfree", profile, shed_load=shed)
    simulate(constant(CONSTANT_RPS[profile_name], seconds, seed), profile, policy, seed=seed, timeline=False)
    return {"profile": profile_name, "targets": [(round(t, 1), round(x, 3)) for t, x in policy.targets]}


def sweep_grid(profile_name: str) -> list[float]:
    p = PRESETS[profile_name]
    cap = p.parallelism * p.max_batch
    return sorted({round(cap * f, 2) for f in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)})


def _mean_over_seeds(runs: list[dict]) -> list[dict]:
    """One point per (profile, target): replica-seconds and bad share averaged over its seeds."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["profile"], r["target"]), []).append(r)
    return [{"profile": p, "target": t, "seeds": len(g),
             "replica_seconds": sum(r["replica_seconds"] for r in g) / len(g),
             "bad_share": sum(r["bad_share"] for r in g) / len(g)} for (p, t), g in groups.items()]


REACH_SMOOTH_S = 10          # the need is the 10-s mean rate: a burst shorter than a replica start is queued


def reach(trace_name: str, profile_name: str, seed: int, quick: bool) -> dict:
    """What no policy that keeps tollfree's scale-down window can do better than, on one trace x profile.

    ``floor_bad``: the requests whose own service time (a batch of one) is over the SLO -- bad whatever
    the capacity. ``bound_rs``: the replica-seconds of a clairvoyant policy that runs every replica 100 %
    busy at its full (batched) throughput on the trace's 10-s mean rate, and, like tollfree, removes a
    replica only after its need has stayed lower for the whole scale-down window (the issue's ~5 min:
    ``scale_down_window_s``). Both are optimistic for the policy (no headroom, bursts under 10 s free),
    so a baseline's figures that ask for fewer replica-seconds than ``bound_rs`` at ``floor_bad`` are
    out of reach of any policy with that window, not only of tollfree's.
    """
    profile = PRESETS[profile_name]
    window = tollfree_config(profile).scale_down_window_s
    full = with_warmup(load_trace(trace_name, seed, quick), WARMUP_S, seed)
    n_warm = int(np.count_nonzero(full.arrivals < WARMUP_S))
    svc_ms = service_times(full, profile, seed)[n_warm:] * 1000.0
    end = int(math.ceil(full.arrivals[-1] + TAIL_S))
    counts = pd.Series(np.bincount(full.arrivals.astype(np.int64), minlength=end + 1)[: end + 1], dtype=float)
    rate = counts.rolling(REACH_SMOOTH_S, min_periods=1).sum() / REACH_SMOOTH_S
    need = np.maximum(1.0, np.ceil(rate / profile.replica_rps() - 1e-9))
    held = need.rolling(int(window) + 1, min_periods=1).max()
    return {"floor_bad": int(np.count_nonzero(svc_ms > profile.slo_ms)),
            "bound_rs": float(held.iloc[int(WARMUP_S):].sum())}


def out_of_reach(b: dict, r: dict) -> bool:
    """Neither way of beating baseline ``b`` is open to a policy bounded by ``r`` (see :func:`reach`)."""
    fewer_bad = b["bad"] > r["floor_bad"] and b["replica_seconds"] >= r["bound_rs"]
    cheaper = 0.7 * b["replica_seconds"] >= r["bound_rs"] and b["bad"] >= r["floor_bad"]
    return not (fewer_bad or cheaper)


def fixed_one(job: tuple) -> dict:
    trace_name, profile_name, target, seed, quick, shed = job
    profile = PRESETS[profile_name]
    policy = Tollfree(tollfree_config(profile, vertical=False, initial_target=target, min_target=min(1.0, target),
                                      max_target=max(1024.0, target), shed_load=shed))
    r = simulate(load_trace(trace_name, seed, quick), profile, policy, seed=seed, timeline=False, warmup_s=WARMUP_S)
    return {"trace": trace_name, "profile": profile_name, "target": target, "shed_load": shed,
            "replica_seconds": r.replica_seconds, "bad": r.bad}


def fixed_jobs(rows: list[tuple[str, str]], seed: int, quick: bool) -> list[tuple]:
    """For :func:`fixed_targets`: each row at every target of the sweep grid and the user's, shed and held."""
    return [(t, p, target, seed, quick, shed) for t, p in rows
            for target in sorted(set(sweep_grid(p)) | {PRESETS[p].user_target}) for shed in (True, False)]


def fixed_targets(runs: list[dict], by: dict) -> list[dict]:
    """Per row: tollfree's horizontal at each fixed target (vertical off), the baselines each run does not
    beat, and the nearest run (fewest baselines not beaten, then fewest replica-seconds). A row that no
    fixed target beats is one the vertical axis cannot win by learning a target: it needs a horizontal or
    gateway that behaves otherwise."""
    out = []
    for key in dict.fromkeys((r["trace"], r["profile"]) for r in runs):
        mine = [dict(r, lost=[b for b in BASELINES if not beats(r, by[(*key, b)])])
                for r in runs if (r["trace"], r["profile"]) == key]
        nearest = min(mine, key=lambda r: (len(r["lost"]), r["replica_seconds"]))
        out.append({"trace": key[0], "profile": key[1], "runs": mine, "nearest": nearest,
                    "any_beats_all": not nearest["lost"]})
    return out


def beats(t: dict, b: dict) -> bool:
    """The issue's rule: fewer bad at no more replica-seconds, or >= 30 % fewer replica-seconds at no more bad."""
    return ((t["bad"] < b["bad"] and t["replica_seconds"] <= b["replica_seconds"])
            or (t["replica_seconds"] <= 0.7 * b["replica_seconds"] and t["bad"] <= b["bad"]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.autoscaler")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="shorter real traces, diurnal and on/off (for a smoke run)")
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hold", action="store_true",
                    help="tollfree with shed_load false (the default config: the gateway holds up to max_queue)")
    ap.add_argument("--fixed", action="store_true",
                    help="for each row not beaten, tollfree's horizontal at fixed targets, shed and held (slower)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    shed = not args.hold
    jobs = [(t, p, pol, args.seed, args.quick, shed) for t in TRACES for p in PROFILES for pol in ALL_POLICIES]
    seconds = 300.0 if args.quick else 600.0
    sweeps = [(p, target, args.seed + k, seconds, shed) for p in PROFILES for target in sweep_grid(p)
              for k in range(SWEEP_SEEDS)]
    learns = [(p, args.seed, seconds, shed) for p in PROFILES]
    print(f"{len(jobs)} trace x profile x policy runs, {len(sweeps)} sweep runs ({SWEEP_SEEDS} seeds), {args.workers} workers ...",
          file=sys.stderr)
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        learned = list(pool.map(learn_one, learns))
        swept = _mean_over_seeds(list(pool.map(sweep_one, sweeps)))
        rows = list(pool.map(run_one, jobs, chunksize=1))
    by = {(r["trace"], r["profile"], r["policy"]): r for r in rows}
    checks: list[dict] = []
    reaches: list[dict] = []
    for t in TRACES:
        for p in PROFILES:
            mine = by[(t, p, "tollfree")]
            lost = [b for b in BASELINES if not beats(mine, by[(t, p, b)])]
            checks.append({"target": "beats every baseline", "trace": t, "profile": p, "ok": not lost,
                           "detail": "all" if not lost else "not vs " + ", ".join(lost)})
            if lost:
                r = reach(t, p, args.seed, args.quick)
                reaches.append({"trace": t, "profile": p, **r,
                                "out_of_reach": [b for b in lost if out_of_reach(by[(t, p, b)], r)]})
    fixed: list[dict] = []
    if args.fixed and reaches:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            runs = list(pool.map(fixed_one, fixed_jobs([(r["trace"], r["profile"]) for r in reaches],
                                                        args.seed, args.quick), chunksize=1))
        fixed = fixed_targets(runs, by)
    for p in PROFILES:
        mine, hpa = by[("spike", p, "tollfree")], by[("spike", p, "hpa")]
        ratio = hpa["bad"] / max(1, mine["bad"])
        checks.append({"target": "spike: >= 5x fewer bad than HPA", "trace": "spike", "profile": p,
                       "ok": ratio >= 5, "detail": f"{ratio:.1f}x ({mine['bad']:,} vs {hpa['bad']:,})"})
        ttc = by[("ramp", p, "tollfree")]["time_to_capacity_s"]
        checks.append({"target": "ramp: capacity < 60 s", "trace": "ramp", "profile": p,
                       "ok": ttc is not None and ttc < 60, "detail": f"{ttc} s"})
    vertical = {}
    for p in PROFILES:
        pts = [s for s in swept if s["profile"] == p]
        ok_pts = [s for s in pts if s["bad_share"] <= 0.01]
        best = min(ok_pts, key=lambda s: s["replica_seconds"]) if ok_pts else None
        targets = next(x["targets"] for x in learned if x["profile"] == p)
        after = [x for _, x in targets[VERTICAL_CYCLES - 1:]]
        if best is None or not after:
            checks.append({"target": "vertical: within 20 % in 3 cycles, steady", "trace": "constant", "profile": p,
                           "ok": False, "detail": "no sweep point with <= 1 % bad" if best is None else "no cycles"})
            continue
        b = best["target"]
        worst = max(abs(x / b - 1) for x in after)
        vertical[p] = {"best_fixed": b, "learned": targets, "sweep": pts}
        checks.append({"target": "vertical: within 20 % in 3 cycles, steady", "trace": "constant", "profile": p,
                       "ok": abs(after[0] / b - 1) <= 0.2 and worst <= 0.2,
                       "detail": f"best fixed {b:g}, after 3 cycles {after[0]:g}, later {min(after):g}..{max(after):g}"})
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps({"rows": rows, "checks": checks, "vertical": vertical, "reach": reaches, "fixed": fixed,
                          "shed_load": shed,
                          "elapsed_s": round(elapsed, 1)}, indent=1))
        return 0
    print(f"{'trace':<11} {'profile':<10} {'policy':<9} {'replica-s':>10} {'bad':>9} {'over SLO':>8} {'rejected':>9} "
          f"{'p50 ms':>8} {'p99 ms':>9} {'to cap s':>8} {'events':>6}  tollfree beats it")
    for t in TRACES:
        for p in PROFILES:
            mine = by[(t, p, "tollfree")]
            for pol in ALL_POLICIES:
                r = by[(t, p, pol)]
                ttc = "-" if r["time_to_capacity_s"] is None else f"{r['time_to_capacity_s']:.0f}"
                verdict = "" if pol == "tollfree" else ("yes" if beats(mine, r) else "NO")
                print(f"{t:<11} {p:<10} {pol:<9} {r['replica_seconds']:>10,.0f} {r['bad']:>9,} "
                      f"{r['over_slo_share']:>8.2%} {r['rejected']:>9,} {r['p50_ms']:>8.1f} {r['p99_ms']:>9.1f} "
                      f"{ttc:>8} {r['scale_events']:>6}  {verdict}")
        print()
    print("targets:")
    for c in checks:
        print(f"  {'PASS' if c['ok'] else 'FAIL'}  {c['target']:<44} {c['trace']:<11} {c['profile']:<10} {c['detail']}")
    if reaches:
        print(f"reach of the rows not beaten (clairvoyant, 100 % busy, 10-s mean rate, the "
              f"{tollfree_config(PRESETS['cpu']).scale_down_window_s:.0f} s scale-down window; see reach()):")
        for r in reaches:
            oor = ", ".join(r["out_of_reach"]) or "none"
            print(f"  {r['trace']:<11} {r['profile']:<10} floor {r['floor_bad']:,} bad, bound {r['bound_rs']:,.0f} "
                  f"replica-s; out of reach of any such policy: {oor}")
    if fixed:
        print("fixed targets (tollfree's horizontal, vertical off; shed = shed_load true, held = false), per row not beaten:")
        for f in fixed:
            n = f["nearest"]
            runs = ", ".join(f"{r['target']:g}{'s' if r['shed_load'] else 'h'}:{r['replica_seconds']:,.0f}rs/{r['bad']:,}"
                             for r in f["runs"])
            print(f"  {f['trace']:<11} {f['profile']:<10} any fixed target beats all: {'yes' if f['any_beats_all'] else 'no'}; "
                  f"nearest {n['target']:g} {'shed' if n['shed_load'] else 'held'} {n['replica_seconds']:,.0f} replica-s "
                  f"{n['bad']:,} bad, not vs {', '.join(n['lost']) or '-'}")
            print(f"    {runs}")
    for p, v in vertical.items():
        sweep = ", ".join(f"{s['target']:g}:{s['replica_seconds']:,.0f}rs/{s['bad_share']:.2%}" for s in v["sweep"])
        print(f"  sweep {p} (mean of {SWEEP_SEEDS} seeds): {sweep}")
        print(f"  learned {p}: {v['learned']}")
    passed = sum(c["ok"] for c in checks)
    print(f"{passed}/{len(checks)} targets met (tollfree with shed_load {str(shed).lower()}); {elapsed:.0f} s wall, "
          f"{args.workers} workers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
