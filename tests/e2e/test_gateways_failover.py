"""Two real gateway processes on one real PostgreSQL state store: the first leads (its replicas, its
autoscaler), the second follows (routes to the leader's replicas from the registry, writes its changes to
the store for the leader to apply). Then ``kill -9`` of the leader under load.

What must hold: an endpoint created through the follower is rolled out by the leader and served by both;
clients that move to the other gateway on a connection error (what a load balancer's redispatch does) see
no failed request across the leader's death; the follower takes the lease within 10 s and adopts the dead
leader's replica (same process, now registered under it) instead of starting another.
"""

from __future__ import annotations

import os
import signal
import time

import httpx
import pytest

from serving.gateway.process import GatewayProcess, environ_with, start_gateway
from serving.replicas.local import process_running
from serving.state.database import open_database
from serving.state.lease import Lease
from serving.state.replica_registry import ReplicaRegistry
from tests.gateways import ENTITY, RetryingClients, rows_body, wait_ready

pytestmark = pytest.mark.slow

NAME = "fraud-shared"


def test_the_follower_serves_the_leaders_replicas_and_takes_over_when_the_leader_dies(world, postgres, record_property):
    url = postgres.url(postgres.new_database())
    env = environ_with({"TOLLFREE_STATE_URL": url, "TOLLFREE_REPLICA_TOKEN": "shared-" + os.urandom(16).hex(),
                        "TOLLFREE_WARM_POOL": "0"})
    logs = world.home / "logs"
    leader = start_gateway(env, logs / "gateway-shared-a.log", timeout_s=240)
    follower: GatewayProcess | None = None
    database = open_database(url)
    adopted: list[int] = []
    clients: RetryingClients | None = None
    try:
        follower = start_gateway(env, logs / "gateway-shared-b.log", timeout_s=240)
        assert Lease(database).holder()[0].split("/")[1] == str(leader.process.pid)
        admin = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}
        created = httpx.post(f"{follower.url}/api/2.0/serving-endpoints", headers=admin, timeout=60,
                             json={"name": NAME, "config": {"served_entities": [ENTITY]}})
        assert created.status_code == 200, created.text
        wait_ready(follower.url, NAME)  # rolled out by the leader, read through the follower
        rows = [r for r in ReplicaRegistry(database).all() if r.endpoint == NAME]
        assert len(rows) == 1 and rows[0].owner_pid == leader.process.pid
        adopted = [rows[0].pid]

        body = rows_body(world)
        deadline = time.monotonic() + 30  # the follower routes to the leader's replica once it has read the registry
        while True:
            reply = httpx.post(f"{follower.url}/serving-endpoints/{NAME}/invocations", content=body,
                               headers={**admin, "content-type": "application/json"},
                               timeout=60)
            if reply.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert reply.status_code == 200, reply.text

        clients = RetryingClients([leader.url, follower.url], f"/serving-endpoints/{NAME}/invocations", body, concurrency=8)
        time.sleep(3.0)
        leader.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        leader.process.wait(10)
        deadline = time.monotonic() + 30
        while True:
            holder = Lease(database).holder()
            if holder is not None and holder[0].split("/")[1] == str(follower.process.pid):
                break
            assert time.monotonic() < deadline, f"no new leader: {holder}"
            time.sleep(0.1)
        took_over_s = time.monotonic() - killed_at
        time.sleep(3.0)  # traffic on the new leader
        outcomes = clients.stop()
        rows = [r for r in ReplicaRegistry(database).all() if r.endpoint == NAME]
    finally:
        if clients is not None:
            clients._stop.set()
        if leader.process.poll() is None:
            leader.process.kill()
        if follower is not None:
            follower.stop(grace_s=60)
        for pid in adopted:  # one of several gateways leaves its replicas for the next leader: none comes here
            if process_running(pid):
                os.killpg(pid, signal.SIGKILL)
        database.engine.dispose()
    after = [o for o in outcomes if o.answered > killed_at]
    record_property("failover_requests", len(outcomes))
    record_property("failover_redispatched", clients.retries)
    record_property("failover_lease_taken_s", round(took_over_s, 2))
    print(f"leader kill -9: {len(outcomes)} requests ({len(after)} after the kill), {clients.retries} "
          f"redispatched, lease taken over in {took_over_s:.2f} s")
    assert {o.status for o in outcomes} == {200}, sorted({o.status for o in outcomes})
    assert len(after) > 20 and all(o.gateway == 1 for o in after if o.sent > killed_at + 1.0)
    assert took_over_s < 10.0
    assert [(r.pid, r.owner_pid) for r in rows] == [(adopted[0], follower.process.pid)], rows
