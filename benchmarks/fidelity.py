"""The simulator against the live gateway: the live 10x-step test's load, replayed through the simulator.

    python -m benchmarks.fidelity [--pools 3,1] [--json]

The live test's serial model and endpoint behind a real gateway (throw-away TOLLFREE_HOME), per warm-pool size: 8 req/s
for 8 s, 80 req/s for 20 s, the scale-down window; every request, the replicas (polled), the decisions, the gateway log
and the replicas' metrics recorded, whence the profile. The send times then run through ``engine.simulate`` with it and
the tollfree policy at the same pool size, shifted so that the simulator's ticks and 5-s boundaries fall on the
gateway's. PASS: within 20 % on replica-seconds and time to capacity. ``meter``: a diagnostic (:class:`GatewayMeter`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import httpx
import numpy as np
import psutil

from benchmarks.load import run_load
from serving.autoscaler.simulate.engine import simulate
from serving.autoscaler.simulate.policies import Tollfree, tollfree_config
from serving.autoscaler.simulate.profiles import ModelProfile
from serving.autoscaler.simulate.traces import Trace
from serving.replicas.replica_set import DEFAULT_MAX_CONCURRENCY
from serving.gateway.process import environ_with, start_gateway, wait_endpoint_ready
from serving.settings import TELEMETRY_OFF, export_defaults

os.environ.update({k: v for k, v in TELEMETRY_OFF.items() if k not in os.environ})  # before MLflow is imported
import mlflow  # noqa: E402
import pandas as pd  # noqa: E402
from mlflow.models import infer_signature  # noqa: E402

from tests.e2e.test_autoscaler_live import BASE_RPS, PER_ROW_S, SCALE_DOWN_WINDOW_S, STEP_RPS  # noqa: E402
from tests.e2e.test_autoscaler_live import replica_processes  # noqa: E402
from tests.models import RowCostModel  # noqa: E402

log = logging.getLogger(__name__)

NAME = "fidelity"
BASE_S, STEP_S = 8.0, 20.0
SETTLE_S = SCALE_DOWN_WINDOW_S + 35.0   # after the load, as the live test waits
SLO_MS = 500.0                          # the endpoint's latency_slo_ms (ScalingConfig's default), for both sides
MAX_REPLICAS = 4
AUTOSCALING = {"scale_down_window_s": SCALE_DOWN_WINDOW_S, "initial_target": 1, "vertical": False, "shed_load": False}
POLL_S = 0.5
GAP_LIMIT = 0.20
BODY = json.dumps({"dataframe_split": {"columns": ["x"], "data": [[1.0]]}}).encode()


# t and sent: s from the load's start; status None: no answer; ready: replica processes serving
Record = NamedTuple("Record", [("sent", float), ("status", Optional[int]), ("latency", float)])
Poll = NamedTuple("Poll", [("t", float), ("ready", int), ("pool_idle", int)])
Timeline = NamedTuple("Timeline", [("t", list), ("ready", list), ("provisioned", list)])


def trace_from_records(records: Sequence[Record], step_at: float, shift: float = 0.0, name: str = "live-step") -> Trace:
    """The recorded send times as a simulator trace, ``shift`` seconds later (see :func:`phase_shift`)."""
    arrivals = np.sort(np.maximum(np.array([r.sent for r in records], dtype=np.float64), 0.0)) + shift
    return Trace(name=name, arrivals=arrivals, step_at=step_at + shift, step_rate=float(STEP_RPS), note="live send times")


def phase_shift(decisions: Sequence[dict], before: float, interval: float = 5.0) -> float:   # decision_interval_s
    """The delay that puts the simulator's ticks and boundaries (1 + k x interval) on the gateway's (its last boundary)."""
    bounds = [d["t"] for d in decisions if d["t"] < before and d.get("inputs", {}).get("boundary") is True]
    return (1.0 - bounds[-1]) % interval if bounds else 0.0


def is_bad(record: Record, slo_ms: float = SLO_MS) -> bool:
    return record.status is None or not 200 <= record.status < 300 or record.latency * 1000.0 > slo_ms


def sim_timeline(timeline: dict[str, list], shift: float) -> Timeline:
    """The simulator's per-second counts on the live run's clock (the seconds before the load dropped)."""
    keep = [i for i, t in enumerate(timeline["t"]) if t - shift >= 0]
    return Timeline([timeline["t"][i] - shift for i in keep], [int(timeline["ready"][i]) for i in keep],
                    [int(timeline["replicas"][i]) for i in keep])


def live_timeline(polls: Sequence[Poll], decisions: Sequence[dict], instants: Sequence[float]) -> Timeline:
    """Live counts at the instants: ready, the last poll; provisioned, what the last decision asked (a decision of the
    tick at the instant, within 0.1 s, counts from the next: the simulator records a second before it decides)."""
    ordered, asked = sorted(polls, key=lambda p: p.t), sorted((d["t"], d["replicas"]) for d in decisions)
    ready = [([p for p in ordered if p.t <= t + 1e-9] or ordered[:1])[-1].ready for t in instants]
    wanted = [([n for td, n in asked if td < t - 0.1] or [r])[-1] for t, r in zip(instants, ready)]
    return Timeline(list(instants), ready, wanted)


def time_to_capacity(tl: Timeline, step_at: float, per_replica_rps: float, share: float = 0.95) -> Optional[float]:
    """From the step to the first instant whose ready replicas serve ``share`` of the step's rate."""
    return next((t - step_at for t, n in zip(tl.t, tl.ready)
                 if t >= step_at and n * per_replica_rps >= share * STEP_RPS), None)


def summarise(tl: Timeline, step_at: float, per_replica_rps: float, bad: int, load_end: float) -> dict[str, Any]:
    down = next((t - load_end for t, n in zip(tl.t, tl.ready) if t >= load_end and n <= 1), None)
    return {"replica_seconds": float(sum(tl.provisioned)), "ready_replica_seconds": float(sum(tl.ready)),
            "time_to_capacity_s": time_to_capacity(tl, step_at, per_replica_rps),
            "peak_replicas": max(tl.provisioned, default=0), "bad": bad, "back_to_one_s": down}


def gap(live: Optional[float], sim: Optional[float]) -> Optional[float]:
    """(sim - live) / live; None when either is missing (0 / 0 is no gap)."""
    return None if live is None or sim is None else (sim - live) / live if live else 0.0 if sim == 0 else math.inf


COMPARED = ("replica_seconds", "ready_replica_seconds", "time_to_capacity_s", "peak_replicas", "bad", "back_to_one_s")
JUDGED = ("replica_seconds", "time_to_capacity_s")


def compare(live: dict[str, Any], sim: dict[str, Any], limit: float = GAP_LIMIT) -> list[dict[str, Any]]:
    """One row per metric: live, sim, the gap, PASS/FAIL for the judged ones."""
    gaps = {key: gap(live.get(key), sim.get(key)) for key in COMPARED}
    return [{"metric": key, "live": live.get(key), "sim": sim.get(key), "gap": g,
             "verdict": "" if key not in JUDGED else "PASS" if g is not None and abs(g) <= limit else "FAIL"}
            for key, g in gaps.items()]


LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
ADDED = re.compile(r"replica pid (\d+) added to (\S+)/\S+ \((\d+) now\)")
STARTED = re.compile(r"(?:started|forked) replica pid (\d+) for (\S*) on port")   # forked: from the fork server


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
    """Each added replica's decision-to-ready (from the first decision asking its count); cold if begun with the model."""
    out: dict[str, list[float]] = {"warm": [], "cold": []}
    asked = sorted((float(d["t"]), int(d["replicas"])) for d in decisions)
    for t, pid, count in added:
        prior = [(td, n) for td, n in asked if td <= t]
        below = [i for i, (_, n) in enumerate(prior) if n < count]
        asking = [td for td, n in prior[(below[-1] + 1 if below else 0):] if n >= count]
        if asking:
            out["cold" if pid in cold_pids else "warm"].append(t - asking[0])
    return out


def refill_times(started: Sequence[tuple], polls: Sequence[Poll]) -> list[float]:
    """Each standby started during the run: from its start (the log) to the next rise of the idle count."""
    ordered = sorted(polls, key=lambda p: p.t)
    rises = [b.t for a, b in zip(ordered, ordered[1:]) if b.pool_idle > a.pool_idle]
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
    return {"service_ms": predict[0] / predict[1] * 1000.0 if predict[1] > 0 else base_ms,
            "service_sigma": sigma, "base_p50_ms": base_ms}


def measured_profile(m: dict[str, Any]) -> ModelProfile:
    """The profile from :func:`measure`: a warm activation's model load; warm and cold starts the decision-to-ready
    times less that load; without a cold start, the standby refills (a cold start less the model) stand in."""
    load_s, starts, refills = m["model_load_s"], m["starts"], m["refills_s"]
    cold_start = (statistics.median(starts["cold"]) - load_s if starts["cold"] else
                  statistics.median(refills) if refills else ModelProfile.cold_start_s)
    return ModelProfile(name="rowcost-live", service_ms=m["service_ms"], service_sigma=m["service_sigma"],
                        parallelism=1, slo_ms=SLO_MS, user_target=1.0, model_load_s=load_s,
                        cold_start_s=max(0.0, cold_start), max_replicas=MAX_REPLICAS,
                        warm_start_s=max(0.0, statistics.median(starts["warm"]) - load_s if starts["warm"] else 0.0))


def metric_sum(text: str, name: str, label: str = "") -> Optional[float]:
    """The sum of the samples ``name{...}`` of a Prometheus text whose labels contain ``label``."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") and label in line.split("}", 1)[0]]
    return sum(values) if values else None


class GatewayMeter(Tollfree):
    """Diagnostic, the policy as the live gateway runs this endpoint: a request waiting in a replica counts as busy, not
    queued (here: up to ``limit - 1`` per ready replica); the vertical off, a replica admits 32, not the policy's limit."""

    name, limit = "tollfree-meter", DEFAULT_MAX_CONCURRENCY

    def initial(self, load: float) -> tuple[int, Optional[int]]:
        return super().initial(load)[0], self.limit

    def step(self, view: Any) -> Any:
        if view.second is not None:
            inside = view.ready * (self.limit - 1)
            view = replace(view, second=replace(view.second, queue_depth=max(0.0, view.second.queue_depth - inside)))
        action = super().step(view)
        return None if action is None else replace(action, admission_limit=self.limit)


def prepare() -> tuple[Path, str]:
    """A throw-away state folder whose registry holds the live test's RowCostModel (``rowcost``); its version."""
    home = Path(tempfile.mkdtemp(prefix="tollfree-fidelity-"))
    os.environ.update(TOLLFREE_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")
    os.environ.setdefault("TOLLFREE_TOKEN", "fidelity-" + secrets.token_hex(16))
    export_defaults(os.environ)
    experiment = mlflow.MlflowClient().create_experiment("fidelity", artifact_location=(home / "artifacts").as_uri())
    frame = pd.DataFrame({"x": [1.0]})
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.pyfunc.log_model(name="model", python_model=RowCostModel(PER_ROW_S), pip_requirements=["mlflow"],
                                       signature=infer_signature(frame, [2.0]), input_example=frame,
                                       registered_model_name="rowcost")
    return home, str(info.registered_model_version)


class Poller(threading.Thread):
    """Every POLL_S (at most 10 min): the replica processes serving and the idle standbys."""

    def __init__(self, url: str, headers: dict[str, str], origin: float) -> None:
        super().__init__(daemon=True)
        self.url, self.headers, self.origin = url, headers, origin
        self.polls, self.halt = list[Poll](), threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=10) as api:
            for _ in range(int(600 / POLL_S)):
                began = time.monotonic()
                try:
                    ready, at = replica_processes(api, NAME), (began + time.monotonic()) / 2 - self.origin
                    idle = api.get(f"/api/2.0/serving-endpoints/{NAME}/autoscaler", params={"limit": 1}).json()
                    self.polls.append(Poll(at, ready, int(idle["warm_pool_idle"])))
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    log.warning("poll failed: %s", exc)
                if self.halt.wait(max(0.0, POLL_S - (time.monotonic() - began))):
                    return


def scrape(gateway_pid: int, token: str, into: dict[int, dict[str, float]]) -> None:
    """Each model replica's predict time and model load, from its own /metrics (with the replica token)."""
    for child in psutil.Process(gateway_pid).children(recursive=True):
        try:
            line = " ".join(child.cmdline()).split()   # a forked replica's is one string, its title
            text = httpx.get(f"http://127.0.0.1:{line[line.index('--port') + 1]}/metrics", timeout=2,
                             headers={"Authorization": f"Bearer {token}"}).text
        except (psutil.NoSuchProcess, ValueError, IndexError, httpx.HTTPError):
            continue
        if (load := metric_sum(text, "tollfree_replica_model_load_seconds")) is not None:
            predict = [metric_sum(text, f"tollfree_replica_predict_seconds_{k}") or 0.0 for k in ("sum", "count")]
            into[child.pid] = {"model_load_s": load, "predict_sum": predict[0], "predict_count": predict[1]}


def run_live(home: Path, version: str, pool: int) -> dict[str, Any]:
    """One live run at warm-pool size ``pool``: records, polls, decisions, the gateway log's events."""
    token, replica_token = os.environ["TOLLFREE_TOKEN"], secrets.token_urlsafe(24)
    headers = {"Authorization": f"Bearer {token}"}
    gateway = start_gateway(environ_with({"TOLLFREE_WARM_POOL": str(pool), "TOLLFREE_REPLICA_TOKEN": replica_token}),
                            home / "logs" / f"gateway-pool{pool}.log")
    try:
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as api:
            api.post("/api/2.0/serving-endpoints", json={"name": NAME, "config": {"served_entities": [{
                "entity_name": "rowcost", "entity_version": version, "max_replicas": MAX_REPLICAS,
                "autoscaling": AUTOSCALING}]}}).raise_for_status()
            wait_endpoint_ready(gateway.url, token, NAME)
            deadline = time.monotonic() + 180   # until the pool is full (a system at rest), at most 3 min
            while (api.get(f"/api/2.0/serving-endpoints/{NAME}/autoscaler").json()["warm_pool_idle"] < pool
                   and time.monotonic() < deadline):
                time.sleep(0.5)
            load_before, url = os.getloadavg()[0], f"{gateway.url}/serving-endpoints/{NAME}/invocations"
            origin, origin_wall = time.monotonic(), time.time()
            poller, replicas = Poller(gateway.url, headers, origin), dict[int, dict[str, float]]()
            poller.start()
            base = asyncio.run(run_load(url, token, BODY, BASE_S, rate=BASE_RPS, timeout_s=30.0))   # the live test's
            step_mono = time.monotonic()
            step = asyncio.run(run_load(url, token, BODY, STEP_S, rate=STEP_RPS, timeout_s=30.0))   # open loop
            outcomes, load_end = base.outcomes + step.outcomes, time.monotonic() - origin
            scrape(gateway.process.pid, replica_token, replicas)   # before the scale-down stops any
            time.sleep(max(0.0, origin + load_end + SETTLE_S - time.monotonic()))
            poller.halt.set()
            poller.join()
            scrape(gateway.process.pid, replica_token, replicas)
            trail = api.get(f"/api/2.0/serving-endpoints/{NAME}/autoscaler", params={"limit": 5000}).json()
            api.delete(f"/api/2.0/serving-endpoints/{NAME}")
    finally:
        gateway.stop()
    return {"pool": pool, "records": [Record(o.started - origin, o.status, o.latency_s) for o in outcomes],
            "polls": poller.polls, "replicas": replicas, "load_end": load_end, "step_at": step_mono - origin,
            "decisions": [{**d, "t": d["t"] - origin} for d in trail["decisions"]],
            "warm_starts": trail["warm_starts"], "cold_starts": trail["cold_starts"],
            "events": log_events(gateway.log_path.read_text(errors="replace").splitlines(), origin_wall),
            "loadavg": [load_before, os.getloadavg()[0]]}


def measure(run: dict[str, Any]) -> dict[str, Any]:
    """The model's profile figures as the live run measured them."""
    reps = run["replicas"]
    predict = (sum(r["predict_sum"] for r in reps.values()), sum(r["predict_count"] for r in reps.values()))
    cold_pids = {pid for _, pid, with_model in run["events"]["started"] if with_model}
    return {**service_figures(run["records"], run["step_at"], predict),
            "model_load_s": statistics.median([r["model_load_s"] for p, r in reps.items() if p not in cold_pids] or [0.0]),
            "starts": start_times(run["decisions"], run["events"]["added"], cold_pids),
            "refills_s": refill_times(run["events"]["started"], run["polls"])}


def replay(run: dict[str, Any], profile: ModelProfile, shift: float, policy: type[Tollfree] = Tollfree) -> Any:
    """The recorded send times through the simulator, with the tollfree policy at the run's pool size."""
    config = tollfree_config(profile, max_replicas=MAX_REPLICAS, **AUTOSCALING)   # the live endpoint's
    return simulate(trace_from_records(run["records"], run["step_at"], shift), profile,
                    policy(config, warm_pool=run["pool"]), seed=0, timeline=True)


def analyse(run: dict[str, Any]) -> dict[str, Any]:
    """Measure, replay (as is, and with the gateway's meter), compare: one pool size's report."""
    profile = measured_profile(m := measure(run))
    shift = phase_shift(run["decisions"], run["step_at"])
    sims = {"sim": replay(run, profile, shift), "meter": replay(run, profile, shift, GatewayMeter)}
    timelines = {key: sim_timeline(result.timeline, shift) for key, result in sims.items()}
    timelines["live"] = live_timeline(run["polls"], run["decisions"], timelines["sim"].t)
    bad = {"live": sum(is_bad(r) for r in run["records"]), **{key: result.bad for key, result in sims.items()}}
    sums = {k: summarise(tl, run["step_at"], profile.replica_rps(), bad[k], run["load_end"]) for k, tl in timelines.items()}
    return {"pool": run["pool"], "requests": len(run["records"]), "loadavg": [round(x, 2) for x in run["loadavg"]],
            "statuses": dict(Counter("none" if r.status is None else str(r.status) for r in run["records"])),
            "warm_starts": run["warm_starts"], "cold_starts": run["cold_starts"], "measured": m,
            "profile": profile.as_dict(), "shift_s": shift, "step_at": run["step_at"], "load_end": run["load_end"],
            **sums, "compare": compare(sums["live"], sums["sim"]), "compare_meter": compare(sums["live"], sums["meter"]),
            "timelines": {key: tl._asdict() for key, tl in timelines.items()}, "trail": run["decisions"],
            "records": [(round(r.sent, 3), r.status, round(r.latency, 4)) for r in run["records"]]}


def table(report: dict[str, Any]) -> str:
    """The comparison, the profile and the replica timelines (changes only) as text."""
    p, m, tl = report["profile"], report["measured"], report["timelines"]
    rounded = json.dumps({k: round(p[k], 3) for k in ("service_ms", "service_sigma", "model_load_s", "warm_start_s",
                                                      "cold_start_s")} | {k: m[k] for k in ("starts", "refills_s")})
    lines = [f"warm pool {report['pool']}: {report['requests']} requests {report['statuses']}; load {report['loadavg']}; "
             f"warm/cold starts {report['warm_starts']}/{report['cold_starts']}; shift {report['shift_s']:.2f} s",
             f"  profile and starts measured: {rounded}",
             f"  {'metric':<22}{'live':>9}{'sim':>9}{'gap':>8}{'':6}{'meter':>9}{'gap':>8}"]
    for row, alt in zip(report["compare"], report["compare_meter"]):
        g, ga = ("-" if r["gap"] is None else f"{r['gap']:+.0%}" for r in (row, alt))
        cells = ["-" if v is None else f"{v:.1f}" for v in (row["live"], row["sim"], alt["sim"])]
        lines.append(f"  {row['metric']:<22}{cells[0]:>9}{cells[1]:>9}{g:>8} {row['verdict']:<5}{cells[2]:>9}{ga:>8}")
    rows = list(zip(tl["live"]["t"], *(tl[k][f] for k in ("live", "sim", "meter") for f in ("ready", "provisioned"))))
    changes = [f"{r[0]:.1f}s {r[1]}/{r[2]} {r[3]}/{r[4]} {r[5]}/{r[6]}" for i, r in enumerate(rows)
               if not i or r[1:] != rows[i - 1][1:]]
    return "\n".join(lines + [f"  ready/provisioned live sim meter (step {report['step_at']:.1f} s, load ends "
                               f"{report['load_end']:.1f} s): " + "; ".join(changes)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", default="3,1", help="warm-pool sizes, comma-separated (default 3,1)")
    parser.add_argument("--json", action="store_true", help="one JSON object (with every request) instead of tables")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    (home, version), began, reports = prepare(), time.monotonic(), []
    try:
        for pool in [int(x) for x in args.pools.split(",") if x.strip()]:
            log.info("live run, warm pool %d", pool)
            reports.append(analyse(run_live(home, version, pool)))
            if not args.json:
                print(table(reports[-1]), flush=True)
    finally:
        if not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
            shutil.rmtree(home, ignore_errors=True)
    passed = all(row["verdict"] != "FAIL" for r in reports for row in r["compare"])
    print(json.dumps({"benchmark": "fidelity", "date": datetime.now().isoformat(timespec="seconds"), "reports": reports,
                      "wall_s": round(time.monotonic() - began, 1), "passed": passed}) if args.json else
          f"fidelity: {'PASS' if passed else 'FAIL'} (gap within {GAP_LIMIT:.0%} on {', '.join(JUDGED)})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
