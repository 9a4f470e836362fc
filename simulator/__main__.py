"""python -m simulator --trace FILE|spike|ramp|diurnal|onoff [--profile NAME|FILE]
    [--policy tollfree|hpa|kpa|ray|kpa-user|ray-user|all] [--seed N] [--warm-pool N] [--json] [--plot FILE.png]

Replays the trace against the profile under each policy and prints, per policy: replica-seconds,
share of requests over the latency SLO, rejected count, p50/p99 latency, seconds to reach capacity
after the trace's step (synthetic traces with a step), and scale events. ``--json`` prints one object
with a key per policy. A CSV trace can be rescaled (``--mean-rps``: time compression up to 6x, then
superposed shifted copies, shape kept); synthetic ones by ``--rate-scale``.
"""

from __future__ import annotations

import argparse
import json
import sys

from simulator.engine import Result, simulate
from simulator.plot import PlotUnavailable, plot
from simulator.policies import POLICIES, USER_VARIANTS, WARM_POOL, make_policy
from simulator.profiles import PRESETS, load_profile
from simulator.traces import SYNTHETIC, resolve


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m simulator", description="Replay a trace against a model profile and autoscaling policies."
    )
    p.add_argument("--trace", required=True, help=f"a CSV file, or one of {', '.join(SYNTHETIC)}")
    p.add_argument("--profile", default="cpu", help=f"a preset ({', '.join(PRESETS)}) or a YAML/JSON file")
    p.add_argument("--policy", default="all", help=f"{'|'.join(POLICIES + USER_VARIANTS)}|all (all = the first four)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by policy")
    p.add_argument("--plot", metavar="FILE.png", help="draw load, replicas and p99 over time")
    p.add_argument("--mean-rps", type=float, help="rescale a CSV trace to this mean rate (shape kept)")
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiply the trace's rate (shape kept)")
    p.add_argument(
        "--warmup", type=float, default=0.0, help="seconds at the initial rate before the trace, not counted"
    )
    p.add_argument(
        "--warm-pool",
        type=int,
        default=WARM_POOL,
        metavar="N",
        help=f"tollfree's standby replicas, refilled one at a time (default {WARM_POOL}, the gateway's "
        "TOLLFREE_WARM_POOL default; 0: cold starts like the pods of HPA/KPA)",
    )
    p.add_argument("--no-warm-pool", action="store_const", const=0, dest="warm_pool", help="the same as --warm-pool 0")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        profile = load_profile(args.profile)
        trace = resolve(args.trace, seed=args.seed, rate_scale=args.rate_scale, mean_rps=args.mean_rps)
        names = list(POLICIES) if args.policy == "all" else [args.policy]
        if args.warm_pool < 0:
            raise ValueError(f"--warm-pool must be >= 0, got {args.warm_pool}")
        policies = [make_policy(n, profile, warm_pool=args.warm_pool) for n in names]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401 -- imported only to fail early, before the runs, if it is missing
        except ImportError:
            print("error: --plot needs matplotlib, which is not installed in this environment", file=sys.stderr)
            return 2
    results: dict[str, Result] = {}
    for policy in policies:
        results[policy.name] = simulate(
            trace, profile, policy, seed=args.seed, timeline=bool(args.plot), warmup_s=args.warmup
        )
    if args.json:
        print(json.dumps({name: r.summary() for name, r in results.items()}, indent=2))
    else:
        print(
            f"trace {trace.name}: {len(trace.arrivals):,} requests over {trace.duration_s:.0f} s "
            f"(mean {trace.mean_rps:.0f} req/s){'; ' + trace.note if trace.note else ''}"
        )
        print(
            f"profile {profile.name}: SLO {profile.slo_ms:g} ms, parallelism {profile.parallelism}, "
            f"model load {profile.model_load_s:g} s; seed {args.seed}"
        )
        header = (
            f"{'policy':<10} {'replica-s':>11} {'over SLO':>9} {'rejected':>9} {'p50 ms':>8} {'p99 ms':>9} "
            f"{'to capacity':>11} {'events':>6}"
        )
        print(header)
        for name, r in results.items():
            ttc = "-" if r.time_to_capacity_s is None else f"{r.time_to_capacity_s:.1f} s"
            if r.time_to_capacity_s is None and trace.step_at is not None:
                ttc = "never"
            print(
                f"{name:<10} {r.replica_seconds:>11,.0f} {r.over_slo_share:>9.2%} {r.rejected:>9,} "
                f"{r.p50_ms:>8.1f} {r.p99_ms:>9.1f} {ttc:>11} {r.scale_events:>6}"
            )
    if args.plot:
        for r in results.values():
            r.timeline["slo_ms"] = profile.slo_ms
        try:
            out = plot(results, args.plot, title=f"{trace.name} x {profile.name}")
        except PlotUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"plot written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
