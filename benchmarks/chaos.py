"""Chaos soak: load through HAProxy for 10 minutes while replicas and gateways are killed and PostgreSQL restarts.

    python -m benchmarks.chaos [--minutes 10] [--home DIR] [--json] [--seed N] [--load 0.5 | --rate R]
                               [--stream-rate 20]

In a throw-away TOLLFREE_HOME (or ``--home``, which must hold ``fraud@champion``, e.g. after ``make demo``, and no
running stack) the real flows build the synthetic world and train the fraud model, in a process of their own. Then
``python -m infra.stack up`` starts the local stack with ``TOLLFREE_GATEWAYS=2`` on free ports: PostgreSQL, two
gateways, HAProxy, redis-server, MLflow, Prefect and its worker with every deployment on its schedule (the demo's
stream feed idle). The endpoint ``chaos`` serves ``fraud@champion`` on 2 replicas and reads a stream input from the
stack's redis-server.

Capacity is measured through HAProxy first (closed loop, 8 clients, 10 s after 3 s of warm-up, 20 rows a request).
Then, for ``--minutes``: an open loop at ``--load`` x capacity (or at ``--rate`` requests a second: the
measurement varies from run to run on a shared machine, a fixed rate compares runs) through HAProxy,
``--stream-rate`` events a second appended to the stream, and faults at random times drawn from ``--seed``
(``benchmarks.chaos_faults``: replica and gateway kills, one PostgreSQL restart). Afterwards the stream drains
and its outputs are counted.
``python -m infra.stack down`` runs at the end, always (an error, Ctrl-C or SIGTERM included).

Printed (``benchmarks.chaos_report``): requests, failures by status (and by when they were sent, beside each
gateway's queue limit then: ``benchmarks.chaos_watch``), p50/p99 overall and p99 during faults, each fault with its
time, the stream's events produced, scored, lost and doubled; with ``--json`` the result as JSON on
stdout (the text then goes to stderr). Exit 0 only with no failure, no event lost or doubled, every fault done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import redis
from redis.typing import EncodableT, FieldT

from benchmarks.chaos_faults import Fault, Injector, Planned, plan
from benchmarks.chaos_report import figures, render
from benchmarks.chaos_stream import Producer, StreamFigures, drain_and_count, stream_input
from benchmarks.chaos_watch import QueueSample, QueueWatch
from benchmarks.common import Provenance, build_fraud_world, fraud_body, log
from benchmarks.load import LoadResult, run_load

NAME = "chaos"
ROWS = 20
GATEWAYS = 2
REPLICAS = 2
MAX_OUTSTANDING = 500
REQUEST_TIMEOUT_S = 40.0  # a client gives up on a request after this (no answer counts as a failure)
DRAIN_TIMEOUT_S = 180.0


def _free_ports() -> dict[str, str]:
    """The stack's port variables, each a port free on loopback now; the gateway's with the ports after it free
    for the gateways behind HAProxy."""
    from infra.services import port_free
    from serving.replicas.local import free_port

    while not all(port_free((gateway := free_port()) + i) for i in range(1, GATEWAYS + 1)):
        pass
    taken = set(range(gateway, gateway + GATEWAYS + 1))
    ports = {}
    for var in (
        "TOLLFREE_PREFECT_PORT",
        "TOLLFREE_MLFLOW_PORT",
        "TOLLFREE_REDIS_PORT",
        "TOLLFREE_POSTGRES_PORT",
        "TOLLFREE_PROMETHEUS_PORT",
    ):
        while (port := free_port()) in taken:
            pass
        taken.add(port)
        ports[var] = str(port)
    return {**ports, "TOLLFREE_GATEWAY_PORT": str(gateway)}


def _stack_environ(home: Path) -> dict[str, str]:
    """What ``infra.stack`` runs with: this process's environment, the state folder, two gateways on free ports,
    and the demo's stream feed idle (it would attach its own stream to an endpoint named ``fraud``)."""
    return {
        **os.environ,
        **_free_ports(),
        "TOLLFREE_HOME": str(home),
        "TOLLFREE_GATEWAYS": str(GATEWAYS),
        "TOLLFREE_SEED_DATA": "0",
        "TOLLFREE_STREAM_RATE": "0",
        "TOLLFREE_STREAM_ENDPOINT": "",
    }


def _world_process(home: Path) -> None:
    """The process that builds the world: what the flows and Feast print goes to stderr, like the progress."""
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    build_fraud_world(home)


def _build_world(home: Path) -> None:
    """``build_fraud_world`` in a process of its own: the temporary Prefect server its flows start ends with it,
    instead of idling beside the run."""
    process = multiprocessing.get_context("spawn").Process(target=_world_process, args=(home,))
    process.start()
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"building the world in {home} failed (exit code {process.exitcode})")


def _stack(command: str, env: dict[str, str]) -> int:
    """``python -m infra.stack COMMAND``, its output on stderr (stdout is kept for the result); its exit code."""
    argv = [sys.executable, "-m", "infra.stack", command]
    # a session of its own: a Ctrl-C at the terminal reaches this process only, which then stops the stack whole
    return subprocess.run(argv, env=env, stdout=sys.stderr, start_new_session=True).returncode


def _create_endpoint(url: str, token: str, redis_url: str) -> None:
    from serving.gateway.process import wait_endpoint_ready

    entity = {"entity_name": "fraud", "entity_alias": "champion", "min_replicas": REPLICAS, "max_replicas": REPLICAS}
    reply = httpx.post(
        f"{url}/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {token}"},
        timeout=120,
        json={"name": NAME, "config": {"served_entities": [entity], "stream_inputs": [stream_input(redis_url)]}},
    )
    reply.raise_for_status()
    wait_endpoint_ready(url, token, NAME, timeout_s=300)


def _capacity(url: str, token: str, body: bytes) -> float:
    asyncio.run(run_load(url, token, body, 3.0, concurrency=4))
    calibration = asyncio.run(run_load(url, token, body, 10.0, concurrency=8))
    log(f"capacity through HAProxy: {calibration.summary()}")
    return calibration.rate()


class _Load:
    """The open loop, in a thread of its own (its event loop there), while the faults are done from the caller's."""

    def __init__(self, url: str, token: str, body: bytes, duration_s: float, rate: float) -> None:
        self.result = LoadResult()
        self._args = (url, token, body, duration_s)
        self._rate = rate
        self._thread = threading.Thread(target=self._run, name="chaos-load", daemon=True)

    def _run(self) -> None:
        self.result = asyncio.run(
            run_load(*self._args, rate=self._rate, max_outstanding=MAX_OUTSTANDING, timeout_s=REQUEST_TIMEOUT_S)
        )

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> LoadResult:
        """The load's outcomes, once it ended: its last requests get their own timeout after its deadline."""
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"the load did not end within {timeout_s:.0f} s of its deadline")
        return self.result


def _inject(injector: Injector, planned: list[Planned], began: float) -> list[Fault]:
    """Each planned fault at its time, or as soon as the one before has ended."""
    done = []
    for fault in planned:
        time.sleep(max(0.0, began + fault.at_s - time.monotonic()))
        done.append(injector.run(fault))
        f = done[-1]
        log(f"{f.at_s:6.1f} s  {f.kind}: {f.error or f.target} (back at {f.ended_s:.1f} s)")
    return done


def _soak(
    env: dict[str, str], args: argparse.Namespace, body: bytes, events: Sequence[dict[FieldT, EncodableT]]
) -> tuple[LoadResult, float, list[Fault], StreamFigures, dict[str, Any], list[QueueSample]]:
    """Calibrate, then the load, the stream and the faults together (the gateways' queues read meanwhile); then
    the stream drained and counted."""
    from infra.stack_config import StackConfig

    config = StackConfig.from_environ(env)
    token = env["TOLLFREE_TOKEN"]
    proxy = config.url("gateway")
    broker = f"redis://127.0.0.1:{config.ports['redis']}"
    _create_endpoint(proxy, token, broker)
    url = f"{proxy}/serving-endpoints/{NAME}/invocations"
    capacity = _capacity(url, token, body)
    rate = args.rate if args.rate is not None else round(args.load * capacity, 1)
    duration_s = args.minutes * 60
    planned = plan(args.seed, duration_s)
    offered = {
        "minutes": args.minutes,
        "seed": args.seed,
        "gateways": GATEWAYS,
        "replicas": REPLICAS,
        "rows": ROWS,
        "capacity_rps": round(capacity, 1),
        "load": None if args.rate is not None else args.load,
        "rate_rps": rate,
        "stream_rate": args.stream_rate,
    }
    log(f"{duration_s:.0f} s at {rate} req/s and {args.stream_rate:g} events/s; faults: {planned}")
    client = redis.Redis(host="127.0.0.1", port=config.ports["redis"])
    producer = Producer(client, events, args.stream_rate)
    load = _Load(url, token, body, duration_s, rate)
    began = time.monotonic()
    watch = QueueWatch(config.gateway_ports(), NAME, token, began)
    load.start()
    producer.start()
    watch.start()
    try:
        faults = _inject(Injector(config, env, NAME, random.Random(args.seed), began), planned, began)
        result = load.join(max(0.0, began + duration_s - time.monotonic()) + REQUEST_TIMEOUT_S + 30)
    finally:
        producer.stop()
        queues = watch.stop()
    log(f"load done: {result.summary()}; draining the stream ...")
    return result, began, faults, drain_and_count(client, producer, DRAIN_TIMEOUT_S), offered, queues


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM as Ctrl-C: the ``finally`` that stops the stack runs."""
    raise KeyboardInterrupt


def _run(args: argparse.Namespace, provenance: Provenance) -> dict[str, Any]:
    """The world, the stack, the soak; the stack stopped and a throw-away state folder removed at the end, always."""
    own_home = args.home is None
    home = Path(tempfile.mkdtemp(prefix="tollfree-chaos-")) if own_home else args.home.resolve()
    if own_home:
        home.chmod(0o711)  # PostgreSQL runs as its own user when we are root: it must reach its folder inside
    os.environ["TOLLFREE_HOME"] = str(home)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    os.environ.setdefault("TOLLFREE_TOKEN", "chaos-" + secrets.token_hex(16))
    from serving.settings import export_defaults

    export_defaults(os.environ)
    env: dict[str, str] | None = None
    try:
        if own_home:
            log(f"building the world in {home} ...")
            _build_world(home)
        from infra.stream_feed import rows

        body, events = fraud_body(home, ROWS), rows(home)
        env = _stack_environ(home)
        if _stack("up", env) != 0:
            raise RuntimeError("python -m infra.stack up failed; its output is above")
        load, began, faults, stream, offered, queues = _soak(env, args, body, events)
        return {**provenance.record(), **figures(load, began, faults, stream, offered, queues)}
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut the stack's stop short
            signal.signal(sig, signal.SIG_IGN)
        if env is not None and _stack("down", env) != 0:
            log(f"python -m infra.stack down failed: processes of the stack in {home} may still run")
        if own_home and not os.environ.get("TOLLFREE_KEEP_TEST_STATE"):
            shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--home", type=Path, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="draws the faults' times, kinds and targets")
    rates = parser.add_mutually_exclusive_group()
    rates.add_argument("--load", type=float, default=0.5, help="fraction of the measured capacity")
    rates.add_argument("--rate", type=float, default=None, help="requests a second, whatever the capacity measured")
    parser.add_argument("--stream-rate", type=float, default=20.0, help="stream events appended per second")
    args = parser.parse_args(argv)
    if (args.rate is not None and args.rate <= 0) or args.load <= 0:
        parser.error("--rate and --load must be above 0")  # refused before anything starts
    plan(args.seed, args.minutes * 60)  # a run too short for a fault is refused before anything starts
    signal.signal(signal.SIGTERM, _interrupt)
    provenance = Provenance("benchmarks.chaos", argv, watched=("benchmarks", "serving", "infra"))
    try:
        report = _run(args, provenance)
    except KeyboardInterrupt:
        log("interrupted: the stack was stopped")
        return 130
    print(render(report), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(report))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
