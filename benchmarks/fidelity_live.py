"""The fidelity benchmark's live side: one scenario's load through a real gateway, everything it did recorded.

In a throw-away TOLLFREE_HOME whose registry holds the live autoscaler test's serial model (``RowCostModel``), a real
gateway (``python -m serving``) at the scenario's warm-pool size serves one endpoint with the scenario's autoscaling
block. Once the pool is full (a system at rest), the scenario's load phases are sent open loop one after the other
(``benchmarks/load.py``), then nothing for the scale-down window and more. Recorded: each request's send time, status
and latency; every POLL_S the replica processes serving and the idle standbys; the autoscaler's decisions; the gateway
log's events (replicas added, processes started); each replica's own ``/metrics`` (predict time, model load), whence
:mod:`benchmarks.fidelity` measures the model's profile and replays the same send times through the simulator.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.fidelity import Poll, Record, log_events, metric_sum
from benchmarks.fidelity_scenarios import MAX_REPLICAS, NAME, Scenario
from benchmarks.load import Outcome, run_load
from serving.gateway.process import environ_with, start_gateway, wait_endpoint_ready
from serving.settings import TELEMETRY_OFF, export_defaults

os.environ.update({k: v for k, v in TELEMETRY_OFF.items() if k not in os.environ})  # before MLflow is imported
import mlflow
import pandas as pd
from mlflow.models import infer_signature

from tests.e2e.test_autoscaler_live import PER_ROW_S, SCALE_DOWN_WINDOW_S, replica_processes
from tests.models import RowCostModel

log = logging.getLogger(__name__)

SETTLE_S = SCALE_DOWN_WINDOW_S + 35.0  # after the load, as the live test waits
POLL_S = 0.5
POOL_WAIT_S = 180.0  # for the warm pool to fill before the load, at most
TIMEOUT_S = 30.0  # a request's client-side timeout
BODY = json.dumps({"dataframe_split": {"columns": ["x"], "data": [[1.0]]}}).encode()


def prepare() -> tuple[Path, str]:
    """A throw-away state folder whose registry holds the live test's RowCostModel (``rowcost``); its version."""
    home = Path(tempfile.mkdtemp(prefix="tollfree-fidelity-"))
    os.environ.update(TOLLFREE_HOME=str(home), MLFLOW_TRACKING_URI=f"sqlite:///{home / 'mlflow.db'}")
    os.environ.setdefault("TOLLFREE_TOKEN", "fidelity-" + secrets.token_hex(16))
    export_defaults(os.environ)
    experiment = mlflow.MlflowClient().create_experiment("fidelity", artifact_location=(home / "artifacts").as_uri())
    frame = pd.DataFrame({"x": [1.0]})
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=RowCostModel(PER_ROW_S),
            pip_requirements=["mlflow"],
            signature=infer_signature(frame, [2.0]),
            input_example=frame,
            registered_model_name="rowcost",
        )
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
            line = " ".join(child.cmdline()).split()  # a forked replica's is one string, its title
            text = httpx.get(
                f"http://127.0.0.1:{line[line.index('--port') + 1]}/metrics",
                timeout=2,
                headers={"Authorization": f"Bearer {token}"},
            ).text
        except (psutil.NoSuchProcess, ValueError, IndexError, httpx.HTTPError):
            continue
        if (load := metric_sum(text, "tollfree_replica_model_load_seconds")) is not None:
            predict = [metric_sum(text, f"tollfree_replica_predict_seconds_{k}") or 0.0 for k in ("sum", "count")]
            into[child.pid] = {"model_load_s": load, "predict_sum": predict[0], "predict_count": predict[1]}


async def send_phases(url: str, token: str, scenario: Scenario) -> tuple[list[Outcome], float]:
    """The scenario's phases open loop on one schedule: each phase begins when the one before it ends, whatever
    is still unanswered (a phase is a ``run_load`` of its own, started on time and gathered at the end); the
    outcomes and the monotonic time the step phase (the first above the base rate) began."""
    began, at = time.monotonic(), 0.0
    starts: list[float] = []
    loads = []
    for rate, seconds in scenario.phases:
        await asyncio.sleep(max(0.0, began + at - time.monotonic()))
        starts.append(time.monotonic())
        loads.append(asyncio.ensure_future(run_load(url, token, BODY, seconds, rate=rate, timeout_s=TIMEOUT_S)))
        at += seconds
    outcomes = [o for result in await asyncio.gather(*loads) for o in result.outcomes]
    return outcomes, starts[scenario.step_index]


def wait_pool_full(api: httpx.Client, pool: int) -> None:
    """Until every standby is up and idle (a system at rest), at most POOL_WAIT_S."""
    deadline = time.monotonic() + POOL_WAIT_S
    while (
        api.get(f"/api/2.0/serving-endpoints/{NAME}/autoscaler").json()["warm_pool_idle"] < pool
        and time.monotonic() < deadline
    ):
        time.sleep(0.5)


def run_live(home: Path, version: str, scenario: Scenario) -> dict[str, Any]:
    """One live run of ``scenario``: records, polls, decisions, the gateway log's events, the replicas' figures."""
    token, replica_token = os.environ["TOLLFREE_TOKEN"], secrets.token_urlsafe(24)
    headers = {"Authorization": f"Bearer {token}"}
    environ = environ_with({"TOLLFREE_WARM_POOL": str(scenario.pool), "TOLLFREE_REPLICA_TOKEN": replica_token})
    gateway = start_gateway(environ, home / "logs" / f"gateway-{scenario.name}.log")
    try:
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=60) as api:
            api.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": NAME,
                    "config": {
                        "served_entities": [
                            {
                                "entity_name": "rowcost",
                                "entity_version": version,
                                "max_replicas": MAX_REPLICAS,
                                "autoscaling": scenario.autoscaling,
                            }
                        ]
                    },
                },
            ).raise_for_status()
            wait_endpoint_ready(gateway.url, token, NAME)
            wait_pool_full(api, scenario.pool)
            load_before, url = os.getloadavg()[0], f"{gateway.url}/serving-endpoints/{NAME}/invocations"
            origin, origin_wall = time.monotonic(), time.time()
            poller, replicas = Poller(gateway.url, headers, origin), dict[int, dict[str, float]]()
            poller.start()
            outcomes, step_mono = asyncio.run(send_phases(url, token, scenario))
            load_end = time.monotonic() - origin
            scrape(gateway.process.pid, replica_token, replicas)  # before the scale-down stops any
            time.sleep(max(0.0, origin + load_end + SETTLE_S - time.monotonic()))
            poller.halt.set()
            poller.join()
            scrape(gateway.process.pid, replica_token, replicas)
            trail = api.get(f"/api/2.0/serving-endpoints/{NAME}/autoscaler", params={"limit": 5000}).json()
            api.delete(f"/api/2.0/serving-endpoints/{NAME}")
    finally:
        gateway.stop()
    return {
        "scenario": scenario.name,
        "pool": scenario.pool,
        "step_at": step_mono - origin,
        "step_rate": scenario.step_rate,
        "load_end": load_end,
        "records": [Record(o.started - origin, o.status, o.latency_s) for o in outcomes],
        "polls": poller.polls,
        "replicas": replicas,
        "decisions": [{**d, "t": d["t"] - origin} for d in trail["decisions"]],
        "warm_starts": trail["warm_starts"],
        "cold_starts": trail["cold_starts"],
        "events": log_events(gateway.log_path.read_text(errors="replace").splitlines(), origin_wall),
        "loadavg": [load_before, os.getloadavg()[0]],
    }
