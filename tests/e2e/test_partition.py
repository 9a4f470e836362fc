"""A partition, not a crash: the leader gateway on a machine of its own (a network namespace, ``tests.netns``) is cut
from PostgreSQL, from the other gateway and from HAProxy by taking its link down, while it lives, then healed.

The leader, A, runs in the namespace with its replicas; the other gateway, B, and PostgreSQL, HAProxy and the
test run on this machine's side of the link. Each gateway's replicas listen on its own address
(``TOLLFREE_REPLICA_HOST``), where the other routes to them. What must hold:
- cut off, A stops leading before its lease can run out, by its own clock, while its statements to the store wait
  unanswered; B takes the lease only after that, and runs the endpoint on replicas of its own: it adopts none of
  A's, whose gateway lives, so no replica has two leaders;
- HAProxy takes A out: once B serves, every request through HAProxy is answered 200;
- healed, A follows B: it stops the replicas it ran as leader once the table lists B's, their rows leave the
  table, and a request sent to A is answered by B's replicas.

A request through HAProxy that was in flight at A when the link went down, or sent before B's own replica was
ready, is not answered by A's replicas, which nobody else can reach: those figures are printed, not asserted.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from serving.gateway.process import GatewayProcess, environ_with, start_gateway
from serving.replicas.local import REPLICA_HOST_ENV, free_port
from serving.state.database import open_database
from serving.state.lease import Lease
from serving.state.replica_table import ReplicaTable
from tests.gateways import ENTITY, replicas_of, rows_body, wait_ready
from tests.netns import Host, NamespacesUnavailable, namespace_host
from tests.services import haproxy_server, postgres_server
from tests.waiting import until
from tests.world import World

pytestmark = pytest.mark.slow

NAME = "fraud-cut"
LEASE_TTL_S = 10.0  # serving.gateway.leadership's default


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    try:
        with namespace_host() as made:
            yield made
    except NamespacesUnavailable as exc:
        pytest.skip(str(exc))


def _logged_at(log: Path, pattern: str) -> float | None:
    """The wall-clock time of the first gateway log line matching ``pattern`` (its asctime, this machine's clock)."""
    for line in log.read_text(errors="replace").splitlines():
        if re.search(pattern, line):
            stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


def _leads(lease: Lease, gateway: GatewayProcess) -> bool:
    """Whether ``gateway`` holds the lease (its holder id is ``host/pid/random``)."""
    holder = lease.holder()
    return holder is not None and holder[0].split("/")[1] == str(gateway.process.pid)


def _replicas_of(gateway: GatewayProcess) -> set[int]:
    return {p.pid for p in replicas_of(gateway)}


class Load:
    """Two closed-loop clients through HAProxy, each request with a 5 s timeout: (sent, answered, status)."""

    def __init__(self, url: str, body: bytes) -> None:
        self.outcomes: list[tuple[float, float, int]] = []
        self._stop = threading.Event()
        headers = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"}

        def client() -> None:
            with httpx.Client(headers=headers, timeout=5) as http:
                while not self._stop.is_set():
                    sent = time.time()
                    try:
                        status = http.post(f"{url}/serving-endpoints/{NAME}/invocations", content=body).status_code
                    except httpx.HTTPError:
                        status = 0
                    self.outcomes.append((sent, time.time(), status))
                    time.sleep(0.05)

        self._threads = [threading.Thread(target=client, daemon=True) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)


def test_a_leader_cut_off_steps_down_before_its_lease_can_run_out_and_rejoins_as_a_follower_once_healed(
    world: World, host: Host, tmp_path_factory: pytest.TempPathFactory, record_property: Callable[[str, object], None]
) -> None:
    logs = world.home / "logs"
    token = "cut-" + os.urandom(16).hex()
    with postgres_server(listen=("127.0.0.1", host.peer), clients=host.network) as postgres:
        database_name = postgres.new_database()
        common = {"TOLLFREE_REPLICA_TOKEN": token, "TOLLFREE_WARM_POOL": "0"}
        env_a = environ_with(
            {
                **common,
                "TOLLFREE_STATE_URL": postgres.url(database_name, host=host.peer),
                REPLICA_HOST_ENV: host.address,
            }
        )
        env_b = environ_with({**common, "TOLLFREE_STATE_URL": postgres.url(database_name), REPLICA_HOST_ENV: host.peer})
        database = open_database(postgres.url(database_name))
        lease = Lease(database)
        a_log, b_log = logs / "partition-a.log", logs / "partition-b.log"
        a = start_gateway(env_a, a_log, host=host.address, port=free_port(), timeout_s=240, runner=host.runner)
        b: GatewayProcess | None = None
        load: Load | None = None
        try:
            until(lambda: _leads(lease, a), "A to lead", 60, every_s=0.2)
            b = start_gateway(env_b, b_log, timeout_s=240)
            b_port = int(b.url.rsplit(":", 1)[1])
            a_port = int(a.url.rsplit(":", 1)[1])
            with haproxy_server([f"{host.address}:{a_port}", b_port], tmp_path_factory.mktemp("haproxy")) as proxy:
                created = httpx.post(
                    f"{proxy}/api/2.0/serving-endpoints",
                    headers={"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"},
                    json={"name": NAME, "config": {"served_entities": [ENTITY]}},
                    timeout=60,
                )
                assert created.status_code == 200, created.text
                wait_ready(a.url, NAME)
                a_replicas = _replicas_of(a)
                assert a_replicas, "the leader runs no replica of the endpoint"
                table = ReplicaTable(database)
                until(lambda: {r.pid for r in table.all()} == a_replicas, "A's replicas in the table", 30, every_s=0.2)

                load = Load(proxy, rows_body(world))
                until(
                    lambda: sum(1 for o in load.outcomes if o[2] == 200) >= 20,
                    "20 answers before the cut",
                    60,
                    every_s=0.2,
                )

                cut = time.time()
                host.cut()
                # B leads: after A stepped down (both gateways log it, on this machine's clock)
                until(lambda: _leads(lease, b), "B to take the lease", 3 * LEASE_TTL_S, every_s=0.2)
                stepped_down = _logged_at(a_log, r"lost the leader lease")
                took_over = _logged_at(b_log, r"taking over as leader")
                assert stepped_down is not None, "A never stepped down while cut off"
                assert took_over is not None
                assert stepped_down < took_over, (stepped_down - cut, took_over - cut)
                assert stepped_down - cut < LEASE_TTL_S, "A led on past the lease's TTL after the cut"

                until(
                    lambda: any(r.owner_pid == b.process.pid for r in table.all()), "B's own replica", 120, every_s=0.2
                )
                b_replicas = _replicas_of(b)
                assert b_replicas and not b_replicas & a_replicas, (a_replicas, b_replicas)
                assert _replicas_of(a) == a_replicas, "A started or lost replicas while cut off"
                b_serves = time.time()
                until(
                    lambda: sum(1 for o in load.outcomes if o[0] > b_serves) >= 40, "40 requests via B", 60, every_s=0.2
                )
                after = [o for o in load.outcomes if o[0] > b_serves]
                assert {o[2] for o in after} == {200}, sorted({o[2] for o in after})

                healed = time.time()
                host.heal()
                until(lambda: not _replicas_of(a), "A to stop the replicas it ran as leader", 60, every_s=0.2)
                until(
                    lambda: {r.pid for r in table.all()} == b_replicas,
                    "only B's replicas in the table",
                    30,
                    every_s=0.2,
                )
                assert _logged_at(a_log, r"following: stopping") is not None
                assert _leads(lease, b)
                direct = httpx.post(
                    f"{a.url}/serving-endpoints/{NAME}/invocations",
                    headers={
                        "Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}",
                        "content-type": "application/json",
                    },
                    content=rows_body(world),
                    timeout=30,
                )
                assert direct.status_code == 200, direct.text
                load.stop()
                window = [o for o in load.outcomes if cut <= o[1] and o[0] <= b_serves]
                figures = {
                    "stepped_down_s": round(stepped_down - cut, 1),
                    "took_over_s": round(took_over - cut, 1),
                    "own_replica_s": round(b_serves - cut, 1),
                    "followed_after_heal_s": round(time.time() - healed, 1),
                    "requests": len(load.outcomes),
                    "not_200_in_window": sum(1 for o in window if o[2] != 200),
                }
                record_property("partition", figures)
                print(
                    f"\npartition: A stepped down {stepped_down - cut:.1f} s after the cut, B took over "
                    f"{took_over - cut:.1f} s after it and served on its own replica {b_serves - cut:.1f} s after it; "
                    f"A followed {time.time() - healed:.1f} s after the heal. Requests through HAProxy: "
                    f"{len(load.outcomes)}, of which {sum(1 for o in window if o[2] != 200)} not answered 200 "
                    f"between the cut and B's replica ({len(window)} in that window), "
                    f"{sum(1 for o in load.outcomes if o[2] != 200 and o not in window)} elsewhere"
                )
        finally:
            if load is not None:
                load.stop()
            for gateway in (a, b):
                if gateway is not None:
                    gateway.stop(grace_s=30)
            database.engine.dispose()
