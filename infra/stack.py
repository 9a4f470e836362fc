"""The local stack: ``python -m infra.stack up|down|status`` (what ``make up``, ``make down``, ``make status`` run).

``up`` starts, in the background and on 127.0.0.1, a Prefect server (API and UI), an MLflow server
(tracking, registry, UI) on the state folder's SQLite database, a redis-server (the stream inputs' broker,
``infra.redis``), the gateway, Prometheus scraping it (``infra.prometheus``), a Prefect process worker, and the
demo's stream feed (``infra.stream_feed``);
it registers every deployment of ``flows/deployments.py`` on the process work pool and prints the URLs. With
``TOLLFREE_GATEWAYS=N`` (N >= 2) the one gateway becomes a PostgreSQL state store, N gateways and HAProxy in
front of them (``infra.services``). ``down`` stops exactly what ``up`` started, by the recorded process ids.
All state stays in ``TOLLFREE_HOME``, so ``up`` after ``down`` finds every run, model and endpoint again.

Ports: ``TOLLFREE_PREFECT_PORT`` (4200), ``TOLLFREE_MLFLOW_PORT`` (5000), ``TOLLFREE_GATEWAY_PORT`` (8080),
``TOLLFREE_REDIS_PORT`` (6380), ``TOLLFREE_PROMETHEUS_PORT`` (9090).
A set ``MLFLOW_TRACKING_URI`` naming a database (SQLite, PostgreSQL, MySQL) becomes the local MLflow
server's backend store; one naming a server (http, databricks) is used as is and no local MLflow server
starts. The admin token comes from ``TOLLFREE_TOKEN`` or is generated once into a 0600 file.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from infra.packages import PackageMissing
from infra.processes import ProcessRecord, marked, spawn, stop_pids, stop_record, stop_records
from infra.services import (
    PROJECT_DIR,
    STARTUP_TIMEOUT_S,
    WORK_POOL,
    Service,
    child_environ,
    port_free,
    services,
    wait_healthy,
)
from infra.stack_config import HOST, PORT_DEFAULTS, StackConfig, admin_token
from infra.stack_record import StackRecord
from infra.stack_status import status

# Seconds each service gets to stop on SIGTERM before SIGKILL (the gateway drains and stops its replicas).
GRACE_S = {
    "stream-feed": 5.0,
    "redis": 20.0,
    "worker": 20.0,
    "gateway": 30.0,
    "mlflow-server": 15.0,
    "prefect-server": 15.0,
    "haproxy": 10.0,
    "prometheus": 10.0,
    "postgres": 30.0,
}


def grace_s(name: str) -> float:
    return GRACE_S.get(name.split("-")[0] if name.startswith("gateway-") else name, 15.0)


def is_gateway(name: str) -> bool:
    return name == "gateway" or name.startswith("gateway-")


# ---- the commands ------------------------------------------------------------------------------


def seed_data(config: StackConfig) -> str | None:
    """The demo's synthetic raw events, ending today, when the state folder has none (so flows have data)."""
    data_dir = config.home / "data"
    if not config.seed_data or (data_dir / "transactions.parquet").exists():
        return None
    from feature_repo import synthetic

    days = 42
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    synthetic.write(
        synthetic.generate(synthetic.SyntheticConfig(days=days, seed=7, start=today - timedelta(days=days))), data_dir
    )
    return str(data_dir)


def start_registration(config: StackConfig, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """``python -m flows.deployments --work-pool ...``: the one list of deployments, on the process pool."""
    batch = config.home / "batch"
    argv = [
        sys.executable,
        "-m",
        "flows.deployments",
        "--work-pool",
        WORK_POOL,
        "--pool-type",
        "process",
        "--batch-input",
        str(batch / "inbox" / "latest.parquet"),
        "--batch-output",
        str(batch / "scores"),
        "--labels-input",
        str(config.home / "inbox" / "labels" / "latest.parquet"),
    ]
    with open(config.log_dir / "register.log", "ab") as err:
        return subprocess.Popen(argv, env=dict(env), cwd=str(PROJECT_DIR), stdout=subprocess.PIPE, stderr=err)


def finish_registration(config: StackConfig, process: subprocess.Popen[bytes]) -> list[str]:
    out, _ = process.communicate(timeout=STARTUP_TIMEOUT_S)
    lines = out.decode().splitlines()
    log_path = config.log_dir / "register.log"
    with open(log_path, "a") as log_file:
        log_file.write("\n".join(lines) + "\n")
    if process.returncode != 0:
        raise RuntimeError(f"registering the deployments failed (code {process.returncode}); see {log_path}")
    return [line.split()[1] for line in lines if line.startswith("registered ")]


def write_env_file(config: StackConfig) -> None:
    token = '"$TOLLFREE_TOKEN"' if config.token_from_env else f'"$(cat {config.token_file})"'
    lines = [
        "# source this file to talk to the local stack (written by make up; holds no secret)",
        f"export TOLLFREE_HOME={config.home}",
        f"export PREFECT_API_URL={config.prefect_api}",
        f"export PREFECT_HOME={config.home / 'prefect'}",
        f"export MLFLOW_TRACKING_URI={config.tracking_uri}",
        f"export TOLLFREE_GATEWAY_URL={config.url('gateway')}",
        f"export TOLLFREE_TOKEN={token}",
    ]
    config.env_file.write_text("\n".join(lines) + "\n")


def up(config: StackConfig, environ: Mapping[str, str]) -> int:
    config.home.mkdir(parents=True, exist_ok=True)
    config.log_dir.mkdir(parents=True, exist_ok=True)
    token = admin_token(config, environ)
    record = StackRecord.load(config.record_path)
    live = {name: r for name, r in (record.services if record else {}).items() if r.alive()}
    if record is not None and live and record.gateways != config.gateways:
        print(
            f"error: the stack runs with {record.gateways} gateway(s); make down first to change "
            f"TOLLFREE_GATEWAYS to {config.gateways}",
            file=sys.stderr,
        )
        return 1
    stack_id = record.stack_id if record and live else uuid.uuid4().hex
    kept = sorted(live)  # before the starts: the record's services (this same dict) gain each one started
    record = StackRecord(stack_id, live, config.gateways)
    env = child_environ(config, environ, stack_id, token)
    try:
        wanted = services(config, env)
    except PackageMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for service in wanted:
        if service.name not in live and service.port is not None and not port_free(service.port):
            raise SystemExit(
                f"error: port {service.port} on {HOST} is taken (for {service.name}); "
                f"set {_port_variable(config, service.port)} to another"
            )
    start = _Starts(config, wanted, record)
    try:
        registered = _start_in_order(config, env, start)
    except (RuntimeError, subprocess.TimeoutExpired, PackageMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        start.undo()
        if not live:  # a stack of this run alone: whatever its processes started goes too
            stop_pids(marked(stack_id), 10.0)
        return 1
    write_env_file(config)
    print(summary(config, registered, kept=kept))
    return 0


class _Starts:
    """Starts services of ``wanted`` by name, those not in the record yet, each recorded (and the record saved)
    as it starts; ``undo`` stops those it started, newest first, and takes them off the record."""

    def __init__(self, config: StackConfig, wanted: list[Service], record: StackRecord) -> None:
        self.config, self.wanted, self.record = config, wanted, record
        self.started: list[ProcessRecord] = []

    def __call__(self, *names: str) -> list[tuple[Service, ProcessRecord]]:
        out = []
        for service in self.wanted:
            if service.name in names and service.name not in self.record.services:
                if service.prepare is not None:
                    service.prepare()
                log_path = self.config.log_dir / f"{service.name}.log"
                proc = spawn(service.name, service.argv, service.env, log_path, PROJECT_DIR, user=service.user)
                self.record.services[service.name] = proc
                self.record.save(self.config.record_path, self.config)
                self.started.append(proc)
                out.append((service, proc))
        return out

    def undo(self) -> None:
        for proc in reversed(self.started):
            stop_record(proc, grace_s(proc.name))
            del self.record.services[proc.name]
        self.record.save(self.config.record_path, self.config)


def _start_in_order(config: StackConfig, env: Mapping[str, str], start: _Starts) -> list[str]:
    """Seed the demo's data, start each service once what it needs answers, and register the deployments
    meanwhile; the deployments registered. A failure stops the registration under way."""
    registration: subprocess.Popen[bytes] | None = None
    try:
        seeded = seed_data(config)
        if seeded:
            print(f"seeded the demo's synthetic raw events into {seeded}")
        prefect = start("prefect-server")
        if config.postgres is not None:  # several gateways: their shared state store, up before them
            wait_healthy(start("postgres"))
            config.postgres.create_database()
        # The gateway need not wait for MLflow: it answers at once, and restoring its endpoints' models goes
        # through the MLflow client, which retries until the server answers.
        broker = start("redis")  # the stream inputs' broker, up before the gateways consume from it
        wait_healthy(broker)
        gateways = [s.name for s in start.wanted if is_gateway(s.name)]
        others = start("mlflow-server") + start(*gateways) + start("haproxy") + start("prometheus")
        wait_healthy(prefect)
        registration = start_registration(config, env)  # needs only Prefect
        worker = start("worker")
        wait_healthy(others)
        registered = finish_registration(config, registration)
        wait_healthy(worker)
        start("stream-feed")  # once the gateways answer: it attaches its stream to the demo's endpoint
        return registered
    except BaseException:
        if registration is not None and registration.poll() is None:
            registration.kill()
        raise


def start_again(config: StackConfig, environ: Mapping[str, str], names: Sequence[str]) -> list[ProcessRecord]:
    """Start the named services of the running stack that no longer run (crashed, killed, stopped), as ``up``
    started them: the same command and environment, marked with the stack's id and put on its record, so
    ``down`` stops them; returns once they answer. A service that still runs is left alone."""
    record = StackRecord.load(config.record_path)
    if record is None:
        raise RuntimeError(f"no stack recorded in {config.record_path}")
    for name in names:
        if name in record.services and not record.services[name].alive():
            del record.services[name]
    env = child_environ(config, environ, record.stack_id, admin_token(config, environ))
    started = _Starts(config, services(config, env), record)(*names)
    wait_healthy(list(started))  # it empties the list it is given
    return [proc for _, proc in started]


def _port_variable(config: StackConfig, port: int) -> str:
    for key, (var, _) in PORT_DEFAULTS.items():
        if config.ports[key] == port:
            return var
    if port == config.postgres_port:
        return "TOLLFREE_POSTGRES_PORT"
    return "TOLLFREE_GATEWAY_PORT (the gateways take the ports after it)"


def summary(config: StackConfig, registered: list[str], kept: list[str]) -> str:
    token = "TOLLFREE_TOKEN from your environment" if config.token_from_env else f"in {config.token_file} (0600)"
    lines = [
        "tollfree is up" + (f" (kept running: {', '.join(kept)})" if kept else "") + ":",
        f"  Prefect UI    {config.url('prefect')}",
        f"  MLflow UI     {config.tracking_uri}" + ("  (external)" if config.external_tracking_uri else ""),
        f"  gateway       {config.url('gateway')}  (metrics at /metrics, bearer token)"
        + (
            f"\n                HAProxy over {config.gateways} gateways on ports "
            f"{', '.join(str(p) for p in config.gateway_ports())}, state store "
            f"{config.postgres.shown if config.postgres is not None else 'TOLLFREE_STATE_URL'}"
            if config.gateways > 1
            else ""
        ),
        f"  Prometheus    {config.url('prometheus')}  (alerts at /alerts; rules in infra/prometheus/rules.yml)",
        f"  admin token   {token}",
        f"  stream        redis://{HOST}:{config.ports['redis']}/transactions, fed at TOLLFREE_STREAM_RATE events/s "
        "(default 5); scores in the stream 'scores' once the endpoint 'fraud' exists",
        f"  deployments   {len(registered)} on work pool {WORK_POOL}: {', '.join(registered)}",
        f"  logs          {config.log_dir}/",
        f"  state         {config.home}/",
        f"talk to it:     source {config.env_file}",
        "then e.g.:      .venv/bin/prefect deployment run materialize/hourly --watch",
        "stop it:        make down",
    ]
    return "\n".join(lines)


def down(config: StackConfig) -> int:
    record = StackRecord.load(config.record_path)
    if record is None:
        print(f"nothing to stop: no stack recorded in {config.record_path}")
        return 0
    gateways = sorted(name for name in record.services if is_gateway(name))
    # the gateways stop together: one of several that stops alone hands its replicas to the next leader
    for names in (
        ["stream-feed"],
        ["prometheus"],
        ["worker"],
        ["haproxy"],
        gateways,
        ["mlflow-server"],
        ["prefect-server"],
        ["postgres"],
        ["redis"],
    ):
        procs = [record.services[name] for name in names if name in record.services]
        running = [p for p in procs if p.alive()]
        killed = stop_records(running, max((grace_s(p.name) for p in running), default=0.0))
        for proc in procs:
            if proc not in running:
                print(f"{proc.name} (pid {proc.pid}) was not running")
            else:
                print(
                    f"stopped {proc.name} (pid {proc.pid})"
                    + (", killed after its grace period" if proc.name in killed else "")
                )
    leftovers = marked(record.stack_id)  # replicas, flow runs: started by ours, perhaps in sessions of their own
    if leftovers:
        forced = stop_pids(leftovers, 10.0)
        print(
            f"stopped {len(leftovers)} process(es) started by the stack: {sorted(p for p, _ in leftovers)}"
            + (f" (killed: {forced})" if forced else "")
        )
    config.record_path.unlink()
    config.env_file.unlink(missing_ok=True)
    print(f"tollfree is down; state kept in {config.home}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.stack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = StackConfig.from_environ(os.environ)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if shutil.which("prefect", path=str(Path(sys.executable).parent)) is None:
        print(f"error: prefect is not installed next to {sys.executable}; run make env", file=sys.stderr)
        return 2
    try:
        if args.command == "up":
            return up(config, os.environ)
        if args.command == "down":
            return down(config)
        return status(config, os.environ)
    except BrokenPipeError:  # e.g. make status | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
