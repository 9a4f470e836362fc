"""The simulator against the live gateway: several load scenarios, each run live, then replayed through the simulator.

    python -m benchmarks.fidelity [--scenarios NAME,NAME] [--list] [--json]

Does the simulator predict what the live autoscaler does? A scenario (benchmarks/fidelity_scenarios.py) is a
load shape (a 10x step, a ramp to it, two bursts), a warm-pool size, and the vertical axis and load shedding on
or off. Its live run (benchmarks/fidelity_live.py) records every request, the replicas, the decisions, the
gateway log and the replicas' metrics; this module measures the model's profile from them, replays the send
times through ``engine.simulate`` with the tollfree policy at the same pool size and autoscaling block (shifted
so that the ticks and 5-s decision boundaries fall on the gateway's) and compares the two on the live run's
clock. A scenario passes when the simulator is within 20 % on replica-seconds and time to capacity, and on bad
requests within 20 % or 1 % of the requests; the run, when every scenario does. ``--json`` prints one object:
the run's provenance and, per scenario, the comparison, the profile, the timelines and every request.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import re
import shutil
import statistics
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np

from benchmarks import fidelity_report
from benchmarks.common import Provenance
from benchmarks.fidelity_scenarios import BY_NAME, MAX_REPLICAS, NAME, SLO_MS, Scenario, listing
from simulator.engine import simulate
from simulator.policies import Tollfree, tollfree_config
from simulator.profiles import ModelProfile
from simulator.traces import Trace
from tests.e2e.test_autoscaler_live import PER_ROW_S, STEP_RPS

log = logging.getLogger(__name__)

GAP_LIMIT = 0.20
BAD_SHARE = 0.01  # bad requests also pass within this share of the scenario's requests


# t and sent: s from the load's start; status None: no answer; ready: replica processes serving
class Record(NamedTuple):
    sent: float
    status: int | None
    latency: float


class Poll(NamedTuple):
    t: float
    ready: int
    pool_idle: int


class Timeline(NamedTuple):
    t: list
    ready: list
    provisioned: list


def trace_from_records(
    records: Sequence[Record], step_at: float, shift: float = 0.0, name: str = "live-step", step_rate: float = STEP_RPS
) -> Trace:
    """The recorded send times as a simulator trace, ``shift`` seconds later (see :func:`phase_shift`)."""
    arrivals = np.sort(np.maximum(np.array([r.sent for r in records], dtype=np.float64), 0.0)) + shift
    return Trace(
        name=name, arrivals=arrivals, step_at=step_at + shift, step_rate=float(step_rate), note="live send times"
    )


def phase_shift(decisions: Sequence[dict], before: float, interval: float = 5.0) -> float:
    """The delay that puts the simulator's ticks and boundaries (1 + k x interval) on the gateway's (its last
    boundary before ``before``); ``interval`` is the autoscaler's decision_interval_s."""
    bounds = [d["t"] for d in decisions if d["t"] < before and d.get("inputs", {}).get("boundary") is True]
    return (1.0 - bounds[-1]) % interval if bounds else 0.0


def is_bad(record: Record, slo_ms: float = SLO_MS) -> bool:
    return record.status is None or not 200 <= record.status < 300 or record.latency * 1000.0 > slo_ms


def sim_timeline(timeline: dict[str, list], shift: float) -> Timeline:
    """The simulator's per-second counts on the live run's clock (the seconds before the load dropped)."""
    keep = [i for i, t in enumerate(timeline["t"]) if t - shift >= 0]
    return Timeline(
        [timeline["t"][i] - shift for i in keep],
        [int(timeline["ready"][i]) for i in keep],
        [int(timeline["replicas"][i]) for i in keep],
    )


def live_timeline(polls: Sequence[Poll], decisions: Sequence[dict], instants: Sequence[float]) -> Timeline:
    """Live counts at the instants: ready, the last poll; provisioned, what the last decision asked (a decision of the
    tick at the instant, within 0.1 s, counts from the next: the simulator records a second before it decides)."""
    ordered, asked = sorted(polls, key=lambda p: p.t), sorted((d["t"], d["replicas"]) for d in decisions)
    ready = [([p for p in ordered if p.t <= t + 1e-9] or ordered[:1])[-1].ready for t in instants]
    wanted = [([n for td, n in asked if td < t - 0.1] or [r])[-1] for t, r in zip(instants, ready)]
    return Timeline(list(instants), ready, wanted)


def time_to_capacity(
    tl: Timeline, step_at: float, per_replica_rps: float, share: float = 0.95, step_rate: float = STEP_RPS
) -> float | None:
    """From the step to the first instant whose ready replicas serve ``share`` of the step's rate."""
    return next(
        (t - step_at for t, n in zip(tl.t, tl.ready) if t >= step_at and n * per_replica_rps >= share * step_rate), None
    )


def summarise(
    tl: Timeline, step_at: float, per_replica_rps: float, bad: int, load_end: float, step_rate: float = STEP_RPS
) -> dict[str, Any]:
    down = next((t - load_end for t, n in zip(tl.t, tl.ready) if t >= load_end and n <= 1), None)
    return {
        "replica_seconds": float(sum(tl.provisioned)),
        "ready_replica_seconds": float(sum(tl.ready)),
        "time_to_capacity_s": time_to_capacity(tl, step_at, per_replica_rps, step_rate=step_rate),
        "peak_replicas": max(tl.provisioned, default=0),
        "bad": bad,
        "back_to_one_s": down,
    }


def gap(live: float | None, sim: float | None) -> float | None:
    """(sim - live) / live; None when either is missing (0 / 0 is no gap)."""
    return None if live is None or sim is None else (sim - live) / live if live else 0.0 if sim == 0 else math.inf


COMPARED = ("replica_seconds", "ready_replica_seconds", "time_to_capacity_s", "peak_replicas", "bad", "back_to_one_s")
JUDGED = ("replica_seconds", "time_to_capacity_s", "bad")


def passes(key: str, live: float | None, sim: float | None, requests: int, limit: float = GAP_LIMIT) -> bool:
    """Within ``limit``; bad requests also within BAD_SHARE of the requests, in absolute terms."""
    g = gap(live, sim)
    if g is not None and abs(g) <= limit:
        return True
    return key == "bad" and live is not None and sim is not None and abs(sim - live) <= BAD_SHARE * requests


def compare(live: dict[str, Any], sim: dict[str, Any], requests: int, limit: float = GAP_LIMIT) -> list[dict[str, Any]]:
    """One row per metric: live, sim, the gap, PASS/FAIL for the judged ones (``requests``: the scenario's count)."""
    return [
        {
            "metric": key,
            "live": live.get(key),
            "sim": sim.get(key),
            "gap": gap(live.get(key), sim.get(key)),
            "verdict": ""
            if key not in JUDGED
            else "PASS"
            if passes(key, live.get(key), sim.get(key), requests, limit)
            else "FAIL",
        }
        for key in COMPARED
    ]


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ADDED = re.compile(r"replica pid (\d+) added to (\S+)/\S+ \((\d+) now\)")
STARTED = re.compile(r"(?:started|forked) replica pid (\d+) for (\S*) on port")  # forked: from the fork server


def log_events(lines: Sequence[str], origin_wall: float, endpoint: str = NAME) -> dict[str, list]:
    """The gateway log's replicas added (t, pid, count) and processes started (t, pid, with a model); t from origin."""
    added, started = [], []
    for line in lines:
        if not (stamp := LOG_TIME.match(line)):
            continue
        t = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - origin_wall
        if (m := ADDED.search(line)) and m.group(2) == endpoint:
            added.append((t, int(m.group(1)), int(m.group(3))))
        elif m := STARTED.search(line):
            started.append((t, int(m.group(1)), bool(m.group(2))))
    return {"added": added, "started": started}


def start_times(decisions: Sequence[dict], added: Sequence[tuple], cold_pids: set[int]) -> dict[str, list[float]]:
    """Each added replica's decision-to-ready (from the first decision asking its count); cold if begun with the
    model."""
    out: dict[str, list[float]] = {"warm": [], "cold": []}
    asked = sorted((float(d["t"]), int(d["replicas"])) for d in decisions)
    for t, pid, count in added:
        prior = [(td, n) for td, n in asked if td <= t]
        below = [i for i, (_, n) in enumerate(prior) if n < count]
        asking = [td for td, n in prior[(below[-1] + 1 if below else 0) :] if n >= count]
        if asking:
            out["cold" if pid in cold_pids else "warm"].append(t - asking[0])
    return out


def refill_times(started: Sequence[tuple], polls: Sequence[Poll]) -> list[float]:
    """Each standby started during the run: from its start (the log) to the next rise of the idle count."""
    ordered = sorted(polls, key=lambda p: p.t)
    rises = [b.t for a, b in itertools.pairwise(ordered) if b.pool_idle > a.pool_idle]
    out = []
    for t, _, with_model in started:
        if not with_model and t >= 0 and (later := [r for r in rises if r > t]):
            out.append(later[0] - t)
            rises.remove(later[0])
    return out


def service_figures(records: Sequence[Record], base_end: float, predict: tuple[float, float]) -> dict[str, float]:
    """The replicas' mean predict time (else the base phase's median latency); sigma from the base phase's latencies."""
    base = np.log(np.asarray([r.latency for r in records if r.sent < base_end and r.status == 200] or [PER_ROW_S]))
    sigma = float((np.percentile(base, 84) - np.percentile(base, 16)) / 2) if len(base) > 2 else 0.0
    base_ms = float(np.exp(np.median(base))) * 1000.0
    return {
        "service_ms": predict[0] / predict[1] * 1000.0 if predict[1] > 0 else base_ms,
        "service_sigma": sigma,
        "base_p50_ms": base_ms,
    }


def measured_profile(m: dict[str, Any]) -> ModelProfile:
    """The profile from :func:`measure`: a warm activation's model load; warm and cold starts the decision-to-ready
    times less that load; without a cold start, the standby refills (a cold start less the model) stand in."""
    load_s, starts, refills = m["model_load_s"], m["starts"], m["refills_s"]
    cold_start = (
        statistics.median(starts["cold"]) - load_s
        if starts["cold"]
        else statistics.median(refills)
        if refills
        else ModelProfile.cold_start_s
    )
    return ModelProfile(
        name="rowcost-live",
        service_ms=m["service_ms"],
        service_sigma=m["service_sigma"],
        parallelism=1,
        slo_ms=SLO_MS,
        user_target=1.0,
        model_load_s=load_s,
        cold_start_s=max(0.0, cold_start),
        max_replicas=MAX_REPLICAS,
        warm_start_s=max(0.0, statistics.median(starts["warm"]) - load_s if starts["warm"] else 0.0),
    )


def metric_sum(text: str, name: str, label: str = "") -> float | None:
    """The sum of the samples ``name{...}`` of a Prometheus text whose labels contain ``label``."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and label in line.split("}", 1)[0]
    ]
    return sum(values) if values else None


def measure(run: dict[str, Any]) -> dict[str, Any]:
    """The model's profile figures as the live run measured them."""
    reps = run["replicas"]
    predict = (sum(r["predict_sum"] for r in reps.values()), sum(r["predict_count"] for r in reps.values()))
    cold_pids = {pid for _, pid, with_model in run["events"]["started"] if with_model}
    return {
        **service_figures(run["records"], run["step_at"], predict),
        "model_load_s": statistics.median([r["model_load_s"] for p, r in reps.items() if p not in cold_pids] or [0.0]),
        "starts": start_times(run["decisions"], run["events"]["added"], cold_pids),
        "refills_s": refill_times(run["events"]["started"], run["polls"]),
    }


def replay(run: dict[str, Any], profile: ModelProfile, shift: float, scenario: Scenario) -> Any:
    """The recorded send times through the simulator: the tollfree policy with the live endpoint's autoscaling block,
    at the scenario's pool size, its starting target seeded from the profile as the gateway seeds it."""
    config = tollfree_config(profile, max_replicas=MAX_REPLICAS, **scenario.autoscaling)
    trace = trace_from_records(run["records"], run["step_at"], shift, f"live-{scenario.name}", scenario.step_rate)
    return simulate(trace, profile, Tollfree(config, warm_pool=scenario.pool, profile=profile), seed=0, timeline=True)


def analyse(run: dict[str, Any], scenario: Scenario) -> dict[str, Any]:
    """Measure, replay, compare: one scenario's report."""
    profile = measured_profile(m := measure(run))
    shift = phase_shift(run["decisions"], run["step_at"])
    result = replay(run, profile, shift, scenario)
    timelines = {"sim": sim_timeline(result.timeline, shift)}
    timelines["live"] = live_timeline(run["polls"], run["decisions"], timelines["sim"].t)
    bad = {"live": sum(is_bad(r) for r in run["records"]), "sim": result.bad}
    sums = {
        k: summarise(tl, run["step_at"], profile.replica_rps(), bad[k], run["load_end"], scenario.step_rate)
        for k, tl in timelines.items()
    }
    rows = compare(sums["live"], sums["sim"], len(run["records"]))
    return {
        "scenario": scenario.name,
        "settings": scenario.settings,
        "autoscaling": scenario.autoscaling,
        "phases": scenario.phases,
        "pool": scenario.pool,
        "requests": len(run["records"]),
        "loadavg": [round(x, 2) for x in run["loadavg"]],
        "statuses": dict(Counter("none" if r.status is None else str(r.status) for r in run["records"])),
        "warm_starts": run["warm_starts"],
        "cold_starts": run["cold_starts"],
        "measured": m,
        "profile": profile.as_dict(),
        "shift_s": shift,
        "step_at": run["step_at"],
        "step_rate": scenario.step_rate,
        "load_end": run["load_end"],
        **sums,
        "compare": rows,
        "passed": all(row["verdict"] != "FAIL" for row in rows),
        "timelines": {key: tl._asdict() for key, tl in timelines.items()},
        "trail": run["decisions"],
        "records": [(round(r.sent, 3), r.status, round(r.latency, 4)) for r in run["records"]],
    }


def chosen(names: str, parser: argparse.ArgumentParser) -> list[Scenario]:
    picked = [n.strip() for n in names.split(",") if n.strip()]
    if unknown := [n for n in picked if n not in BY_NAME]:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; --list shows them")
    return [BY_NAME[n] for n in picked]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios",
        default=",".join(BY_NAME),
        help="scenario names, comma-separated, run in that order (default: all; see --list)",
    )
    parser.add_argument("--list", action="store_true", help="print the scenarios with their settings and exit")
    parser.add_argument("--json", action="store_true", help="one JSON object (with every request) instead of tables")
    args = parser.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    scenarios = chosen(args.scenarios, parser)
    from benchmarks.fidelity_live import prepare, run_live  # the gateway, MLflow: only for a live run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    provenance = Provenance("benchmarks.fidelity", argv)
    (home, version), reports = prepare(), []
    try:
        for scenario in scenarios:
            log.info("live run, scenario %s (%s)", scenario.name, scenario.settings)
            reports.append(analyse(run_live(home, version, scenario), scenario))
            if not args.json:
                print(fidelity_report.table(reports[-1]), flush=True)
    finally:
        if not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
            shutil.rmtree(home, ignore_errors=True)
    passed = all(r["passed"] for r in reports)
    if args.json:
        print(json.dumps({**provenance.record(), "benchmark": "fidelity", "reports": reports, "passed": passed}))
    else:
        verdict = (
            f"fidelity: {'PASS' if passed else 'FAIL'} ({sum(r['passed'] for r in reports)}/{len(reports)} "
            f"scenarios; within {GAP_LIMIT:.0%} on replica_seconds and time_to_capacity_s, on bad within "
            f"{GAP_LIMIT:.0%} or {BAD_SHARE:.0%} of the requests)"
        )
        print("\n".join(["summary:"] + [fidelity_report.summary_line(r) for r in reports] + [verdict]))
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
