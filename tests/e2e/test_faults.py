"""Faults, injected for real into real processes: kill -9 of each replica in turn under load, a gateway stopped
gracefully and restarted, a gateway killed -9 and restarted, Redis (the online store) killed -9 and
brought back. Each test says what load it holds and asserts what is lost (nothing, or the counted
unflushed tail of a crashed gateway).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.load import LoadResult, run_load
from serving.gateway.process import GatewayProcess, environ_with, start_gateway
from serving.inference_log import read_inference_log
from serving.replicas.local import free_port
from serving.state.database import open_database
from serving.state.replica_table import ReplicaTable
from tests.gateways import ENTITY, RetryingClients, create, get, own_state, replicas_of, rows_body, wait_ready
from tests.services import ensure_redis_server
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow


class Background:
    """``run_load`` in a thread, so the test can inject a fault while it runs."""

    def __init__(self, url: str, body: bytes, duration_s: float, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.result: LoadResult | None = None
        self.error: BaseException | None = None

        def go() -> None:
            try:
                self.result = asyncio.run(run_load(url, os.environ["TOLLFREE_TOKEN"], body, duration_s, **kwargs))
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=go, daemon=True)
        self.thread.start()

    def join(self, timeout_s: float) -> LoadResult:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the load generator hung"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


@pytest.fixture
def gateway_env(world, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Each test's gateways: a state store of the test's own, shared by its restarts."""
    return environ_with({"TOLLFREE_WARM_POOL": "0", **own_state(tmp_path_factory.mktemp("state"))})


def test_kill_9_of_each_replica_in_turn_under_load_fails_no_request_then_stop_and_restart_the_gateway(
    world, gateway_env, record_property
):
    """Load: 8 concurrent clients for 12 s on an endpoint pinned at 2 replicas (autoscaler on), below capacity.
    Fault: kill -9 of one replica 4 s in, and of the other a second later (its partner's replacement may not be
    up yet). Then a graceful stop (SIGTERM) and a restart on the same state.

    Holds: every request answered 200 (in flight on a dead replica: sent once more to the other or to a
    replacement; arriving while none is up: held for the replacement, not refused), both replicas replaced,
    every answered request in the inference log after the graceful stop (nothing lost; a 400 and a 401 sent just
    before the stop included, 200s with their served features and model version, no token in any logged input),
    and after the restart the endpoint says NOT_READY until its replicas are up, a request sent meanwhile waits
    and is answered (no 503), and its config comes back as it was and serves."""
    body = rows_body(world)
    log = world.home / "logs" / "gateway-faults.log"
    gateway = start_gateway(gateway_env, log, timeout_s=240)
    name = "fraud-faults"
    try:
        create(gateway, name, {**ENTITY, "min_replicas": 2, "max_replicas": 2})
        assert ready_replicas(gateway, name) == 2
        before = [psutil.Process(pid) for pid in endpoint_pids(gateway, name)]
        assert len(before) == 2, before
        url = f"{gateway.url}/serving-endpoints/{name}/invocations"
        load = Background(url, body, 12.0, concurrency=8, timeout_s=40.0)
        time.sleep(4.0)  # the load's first third, before the fault
        victims = before
        victims[0].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        time.sleep(1.0)  # the pace: the next replica a second later
        victims[1].send_signal(signal.SIGKILL)
        result = load.join(90)
        record_property("kill_load", result.summary())
        print("kill -9 of each replica in turn under load:", result.summary())
        statuses = result.statuses()
        failed = [(round(o.started - killed_at, 1), o.reason) for o in result.outcomes if o.status != 200]
        assert set(statuses) == {"200"}, (statuses, "(s after the first kill, reason):", failed[:10])
        assert all(o.status is not None for o in result.outcomes), "a request hung or lost its connection"
        assert len(result.with_status(200)) > 50
        assert any(o.started > killed_at + 1.0 for o in result.with_status(200)), "the endpoint kept serving"
        # both replaced: two new, live replicas in the endpoint's routing
        deadline = time.monotonic() + 240
        while True:
            now = endpoint_pids(gateway, name)
            if len(now) == 2 and not set(now) & {v.pid for v in victims} and ready_replicas(gateway, name) == 2:
                break
            assert time.monotonic() < deadline, f"replicas not replaced: {now}"
            time.sleep(1.0)
        replaced_in = time.monotonic() - killed_at
        record_property("replicas_replaced_s", round(replaced_in, 1))
        after = httpx.post(
            url,
            content=body,
            headers={"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"},
            timeout=60,
        )
        assert after.status_code == 200, after.text
        refused = refused_requests(url)  # answered just before the stop: the flush must take them too
        config_before = get(gateway, f"/api/2.0/serving-endpoints/{name}").json()
    finally:
        code = gateway.stop(grace_s=60)
    # uvicorn re-raises the SIGTERM it handled once its graceful shutdown is done: -15 is a clean stop
    assert code in (0, -signal.SIGTERM), f"graceful stop exited {code}; see {log}"
    assert "Application shutdown complete" in log.read_text(errors="replace")
    assert not replicas_of_pids([p.pid for p in before]), "replicas outlived the gateway"
    answered = {o.request_id for o in result.outcomes if o.status is not None}
    logged = read_inference_log(world.settings.inference_log_dir, endpoint=name)
    missing = answered - set(logged["request_id"])
    record_property("graceful_stop_lost", len(missing))
    assert not missing, f"{len(missing)} answered requests missing from the inference log after a graceful stop"
    assert set(logged[logged["request_id"].isin(answered)]["status_code"]) == {200}
    served = logged[logged["request_id"].isin(answered) & (logged["status_code"] == 200)]
    assert served["served_features"].notna().all() and served["model_version"].notna().all()
    by_id = logged.set_index("request_id")
    assert {i: int(by_id.loc[i, "status_code"]) for i in refused} == refused, "refused requests are logged too"
    assert not logged["inputs"].fillna("").str.contains(os.environ["TOLLFREE_TOKEN"]).any()

    # restart on the same state: the graceful stop took the replicas, so new ones start; meanwhile the endpoint
    # says NOT_READY and a request waits for them instead of getting a 503. Then the config, version and alias
    # are back and serve.
    restarted = start_gateway(gateway_env, log, timeout_s=240)
    try:
        starting = get(restarted, f"/api/2.0/serving-endpoints/{name}").json()["state"]
        assert starting == {"ready": "NOT_READY", "config_update": "IN_PROGRESS"}, starting
        sent = time.monotonic()
        waited = httpx.post(
            f"{restarted.url}/serving-endpoints/{name}/invocations",
            content=body,
            timeout=60,
            headers={"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"},
        )
        assert waited.status_code == 200, waited.text
        record_property("restart_first_request_waited_s", round(time.monotonic() - sent, 1))
        view = wait_ready(restarted.url, name)
        for key in ("name", "config", "id", "creator", "creation_timestamp"):
            if key in config_before:
                assert view.get(key) == config_before[key], key
        reply = httpx.post(
            f"{restarted.url}/serving-endpoints/{name}/invocations",
            content=body,
            timeout=60,
            headers={"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"},
        )
        assert reply.status_code == 200 and reply.headers["served-model-name"] == "fraud-champion"
        from mlflow import MlflowClient

        alias = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_model_version_by_alias(MODEL_NAME, "champion")
        assert [e["entity_version"] for e in view["config"]["served_entities"]] == [str(alias.version)]
    finally:
        restarted.stop(grace_s=60)


def refused_requests(url: str) -> dict[str, int]:
    """A bad body (400) and a missing token (401), each with its request id: {request id: status}."""
    sent = {}
    for request_id, body, headers, status in (
        (
            "faults-bad-body",
            b'{"dataframe_records": [{"customer_id": 1}]}',
            {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"},
            400,
        ),
        ("faults-no-token", b'{"dataframe_records": []}', {}, 401),
    ):
        reply = httpx.post(
            url,
            content=body,
            timeout=60,
            headers={**headers, "content-type": "application/json", "x-request-id": request_id},
        )
        assert reply.status_code == status, reply.text
        sent[request_id] = status
    return sent


def endpoint_pids(gateway: GatewayProcess, name: str) -> list[int]:
    """The pids of the live replicas in the endpoint's routing, as its gateway lists them."""
    listed = get(gateway, f"/api/2.0/serving-endpoints/{name}/replicas").json()["replicas"]
    return [r["pid"] for r in listed if r["alive"]]


def ready_replicas(gateway: GatewayProcess, name: str) -> float:
    """The gateway's own count of ready replicas in the endpoint's routing (``tollfree_replicas``)."""
    text = get(gateway, "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tollfree_replicas{") and f'endpoint="{name}"' in line
    )


def replicas_of_pids(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


def test_a_crashed_gateway_loses_at_most_its_unflushed_tail_and_its_successor_adopts_the_replicas(
    world, gateway_env, record_property
):
    """Load: 50 requests a second (open loop) for 6 s. Fault: kill -9 of the gateway 5 s in. Holds: every request
    answered more than 2 s before the crash (two flush intervals of the inference log) is in the log; the lost tail
    is counted and reported. Its replicas, in their own sessions, outlive it. Then 4 clients that retry connection
    errors (each pausing 20 ms after an answer) keep sending while a new gateway starts on the same port and state:
    it adopts the live replicas (no new process, the registry names them under the new gateway), answers within 1 s
    of listening, and no request fails; its graceful stop then stops the adopted replicas."""
    body = rows_body(world, seed=9)
    log = world.home / "logs" / "gateway-crash.log"
    port = free_port()
    gateway = start_gateway(gateway_env, log, port=port, timeout_s=240)
    name = "fraud-crash"
    orphans: list[int] = []
    restarted: GatewayProcess | None = None
    clients: RetryingClients | None = None
    try:
        create(gateway, name)
        mine = _registered(gateway_env["TOLLFREE_STATE_URL"], name, gateway.process.pid)
        assert mine and set(mine) <= {p.pid for p in replicas_of(gateway)}
        url = f"{gateway.url}/serving-endpoints/{name}/invocations"
        load = Background(url, body, 6.0, rate=50, timeout_s=20.0)
        time.sleep(5.0)
        orphans = [p.pid for p in psutil.Process(gateway.process.pid).children(recursive=True)]
        gateway.process.send_signal(signal.SIGKILL)
        crashed_at = time.monotonic()
        gateway.process.wait(10)
        result = load.join(60)
        answered = [o for o in result.outcomes if o.status == 200]
        logged = set(read_inference_log(world.settings.inference_log_dir, endpoint=name)["request_id"])
        lost = [o for o in answered if o.request_id not in logged]
        old_enough = [o for o in lost if o.started + o.latency_s < crashed_at - 2.0]
        record_property("crash_answered", len(answered))
        record_property("crash_lost_tail", len(lost))
        print(f"gateway kill -9: {len(answered)} answered, {len(lost)} not in the inference log (the unflushed tail)")
        assert len(answered) > 20
        assert not old_enough, f"{len(old_enough)} requests answered over 2 s before the crash were lost"
        assert replicas_of_pids(mine) == mine, "the replicas died with their gateway"

        clients = RetryingClients(
            [gateway.url], f"/serving-endpoints/{name}/invocations", body, concurrency=4, think_s=0.02
        )
        restarted = start_gateway(gateway_env, log, port=port, timeout_s=240)
        listening_at = time.monotonic()
        deadline = time.monotonic() + 60
        while not [o for o in clients.outcomes if o.answered >= listening_at] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # a second of traffic on the adopted replicas
        outcomes = clients.stop()
        view = get(restarted, f"/api/2.0/serving-endpoints/{name}").json()
        registry = ReplicaTable(open_database(gateway_env["TOLLFREE_STATE_URL"])).all()
        new_owner = restarted.process.pid
    finally:
        if gateway.process.poll() is None:
            gateway.process.kill()
        if clients is not None:
            clients._stop.set()
        if restarted is not None:
            restarted.stop(grace_s=60)
        for pid in replicas_of_pids(orphans):
            os.kill(pid, signal.SIGKILL)  # whatever the new gateway did not take (the test failed before)
    first_answer_s = min(o.answered for o in outcomes if o.answered >= listening_at) - listening_at
    record_property("restart_requests", len(outcomes))
    record_property("restart_retries", clients.retries)
    record_property("restart_first_answer_s", round(first_answer_s, 3))
    print(
        f"restart after kill -9: {len(outcomes)} requests, {clients.retries} connection retries, "
        f"first answer {first_answer_s * 1000:.0f} ms after the new gateway listened"
    )
    assert {o.status for o in outcomes} == {200}, sorted({o.status for o in outcomes})
    assert first_answer_s < 1.0
    assert view["state"]["ready"] == "READY"
    rows = {row.pid: row for row in registry if row.endpoint == name}
    assert set(rows) == set(mine), "the new gateway started replicas instead of adopting the live ones"
    assert {row.owner_pid for row in rows.values()} == {new_owner}
    assert "adopted replica pid" in log.read_text(errors="replace")
    assert not replicas_of_pids(mine), "the adopted replicas outlived the graceful stop of their new gateway"


def _registered(state_url: str, endpoint: str, owner: int, timeout_s: float = 15.0) -> list[int]:
    """The pids the replica table lists for ``endpoint`` under gateway ``owner`` (written just after a change)."""
    registry = ReplicaTable(open_database(state_url))
    deadline = time.monotonic() + timeout_s
    while True:
        pids = sorted(r.pid for r in registry.all() if r.endpoint == endpoint and r.owner_pid == owner)
        if pids or time.monotonic() > deadline:
            registry.database.engine.dispose()
            return pids
        time.sleep(0.1)


class Redis:
    """A redis-server we can kill -9 and bring back on the same port with its data (append-only file)."""

    def __init__(self) -> None:
        self.binary = ensure_redis_server()
        self.port = free_port()
        self.workdir = tempfile.mkdtemp(prefix="tollfree-redis-faults-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                self.workdir,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            assert self.process.poll() is None, "redis-server exited"
            try:
                import socket

                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            assert time.monotonic() < deadline, "redis-server did not answer PING"
            time.sleep(0.1)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        shutil.rmtree(self.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def redis(world) -> Iterator[Redis]:  # type: ignore[no-untyped-def]
    """A real redis-server holding the world's online features (materialised like the parity test does)."""
    from datetime import datetime

    import pandas as pd

    from feature_repo import store as feature_store

    server = Redis()
    server.start()
    try:
        store = feature_store.open_store(world.home, feature_store.OnlineStoreChoice("redis", server.address))
        feature_store.apply_definitions(store)
        tables = {
            n: pd.read_parquet(world.home / p, columns=["feature_ts"]) for n, p in feature_store.TABLE_PATHS.items()
        }
        start = min(t["feature_ts"].min() for t in tables.values()).to_pydatetime()
        store.materialize(start_date=start, end_date=datetime.now(UTC))
        yield server
    finally:
        server.close()


def test_redis_down_gives_a_clear_503_and_the_endpoint_recovers_by_itself(world, gateway_env, redis, record_property):
    """Load: 50 requests a second (open loop) for 14 s on an endpoint whose replica reads Redis. Fault: kill -9 of
    redis-server 3 s in, restarted on the same port (its append-only file reloaded) 4 s later. Holds:
    every answer is 200 or a 503 naming the online store (no 500, no hang), and the endpoint serves
    200 again after Redis returns with no action on the gateway."""
    body = rows_body(world, seed=13)
    env = {**gateway_env, "TOLLFREE_ONLINE_STORE": "redis", "TOLLFREE_REDIS": redis.address}
    log = world.home / "logs" / "gateway-redis.log"
    gateway = start_gateway(env, log, timeout_s=240)
    name = "fraud-redis"
    headers = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"}
    try:
        create(gateway, name)
        url = f"{gateway.url}/serving-endpoints/{name}/invocations"
        assert httpx.post(url, content=body, headers=headers, timeout=60).status_code == 200
        load = Background(url, body, 14.0, rate=50, timeout_s=40.0)
        time.sleep(3.0)
        redis.kill()
        down_at = time.monotonic()
        time.sleep(1.0)
        during = httpx.post(url, content=body, headers=headers, timeout=60)
        time.sleep(3.0)
        redis.start()
        up_at = time.monotonic()
        result = load.join(120)
        record_property("redis_load", result.summary())
        print("redis kill -9 under load:", result.summary())
        assert during.status_code == 503, during.text
        assert during.json() == {
            "error_code": "TEMPORARILY_UNAVAILABLE",
            "message": "the online feature store is unavailable",
        }
        statuses = result.statuses()
        turned_away = [(round(o.started - down_at, 1), o.reason) for o in result.with_status(429)]
        assert set(statuses) <= {"200", "503"}, (statuses, "429s (s after the kill, reason):", turned_away[:10])
        assert all(o.status is not None for o in result.outcomes)
        assert any(down_at < o.started < up_at for o in result.with_status(503))
        late = [o for o in result.outcomes if o.started > up_at + 2.0]
        assert late and all(o.status == 200 for o in late), (
            "the endpoint did not recover by itself after Redis returned"
        )
        assert httpx.post(url, content=body, headers=headers, timeout=60).status_code == 200
    finally:
        gateway.stop(grace_s=60)


def _mount_tiny_tmpfs(path: Path, size: str = "128k") -> bool:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def _fill(path: Path) -> Path:
    filler = path / "filler"
    try:
        with open(filler, "wb") as out:
            while True:
                out.write(b"\0" * 4096)
                out.flush()
                os.fsync(out.fileno())
    except OSError:
        pass  # ENOSPC: the disk is full
    return filler


def _lost_records(gateway: GatewayProcess) -> float:
    text = get(gateway, "/metrics").text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("tollfree_inference_log_records_lost_total{") and 'reason="write_error"' in line
    )


def test_inference_log_disk_full_still_serves_and_counts_the_loss(world, gateway_env, tmp_path, record_property):
    """Load: 30 sequential requests with the inference log's folder on a full 128 kB tmpfs, then 10 more
    once space is freed. Holds: all 40 answered 200; the 30 records that could not be written are
    counted in ``tollfree_inference_log_records_lost_total{reason="write_error"}``; the log writes
    again by itself once the disk has room (the 10 later records are there)."""
    home = tmp_path / "home"
    home.mkdir()
    for entry in world.home.iterdir():  # the world's data, features and registry; its own endpoints and logs
        if entry.name not in ("inference_log", "logs", "prefect") and not entry.name.startswith("endpoints.db"):
            (home / entry.name).symlink_to(entry)
    log_dir = home / "inference_log"
    if not _mount_tiny_tmpfs(log_dir):
        pytest.skip("mounting a tmpfs needs root with CAP_SYS_ADMIN; disk-full not injected here")
    try:
        filler = _fill(log_dir)
        env = {**gateway_env, "TOLLFREE_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
        gateway = start_gateway(env, home / "logs" / "gateway-diskfull.log", timeout_s=240)
        name = "fraud-diskfull"
        headers = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"}
        body = rows_body(world, seed=17)
        try:
            create(gateway, name)
            url = f"{gateway.url}/serving-endpoints/{name}/invocations"
            full = [httpx.post(url, content=body, headers=headers, timeout=60) for _ in range(30)]
            assert [r.status_code for r in full] == [200] * 30
            deadline = time.monotonic() + 30
            while _lost_records(gateway) < 30:
                assert time.monotonic() < deadline, f"lost records counted: {_lost_records(gateway)}"
                time.sleep(0.5)
            lost = _lost_records(gateway)
            record_property("disk_full_lost_counted", lost)
            filler.unlink()
            later_ids = []
            for i in range(10):
                reply = httpx.post(
                    url, content=body, headers={**headers, "x-request-id": f"after-full-{i}"}, timeout=60
                )
                assert reply.status_code == 200
                later_ids.append(f"after-full-{i}")
        finally:
            gateway.stop(grace_s=60)
        logged = set(read_inference_log(log_dir, endpoint=name)["request_id"])
        assert set(later_ids) <= logged, "the inference log did not recover once the disk had room"
        assert not {r.headers["x-request-id"] for r in full} & logged  # those were lost, and counted
    finally:
        subprocess.run(["umount", "-l", str(log_dir)], capture_output=True)
