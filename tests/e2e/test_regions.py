"""Two regions on one machine, each a network namespace of the test's own with its own state folder (registry,
feature store, endpoint store, inference log), gateway and replicas; the test, the clients and the flows run on
this machine's side of both links.

What must hold:
- ``flows.apply`` of one endpoints file makes both regions serve the same endpoint; the same file again changes
  nothing and restarts no replica; a file with a bad field, or naming an alias the registry lacks, changes nothing;
- the failover client (``tollfree_client``) at 16 concurrent clients loses no request when region A's gateway is
  killed (``kill -9``) or its link is taken down (a partition), sends to region B within a second of the fault and
  comes back to A within 10 s of A being back;
- HAProxy with region B's gateway as a backup server keeps answering through region A's kill (the requests it
  sent to A in the second before its health check took A out are counted, not asserted);
- the regions' online stores, materialized from the same offline data, hold the same features
  (``flows.region_parity``), and a changed entity in one is counted;
- a promotion in region A, replicated (``flows.replicate``) and applied in region B, is served there: the same
  version's files (digest) on B's endpoint.

Each region's registry is an MLflow SQLite file in its state folder (not a tracking server behind its link), as
a region of one gateway runs by default; the regions share no file.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pandas as pd
import pytest
from mlflow import MlflowClient

from feature_repo import store as feature_store
from flows.apply import apply_endpoints
from flows.endpoint_file import EndpointFileError
from flows.region_parity import compare_regions, sample_keys, stored_features
from flows.region_parity import main as region_parity_main
from flows.replicate import replicate
from serving.gateway.process import GatewayProcess, environ_with, start_gateway
from serving.registry.replication import VERIFIED_TAG
from serving.replicas.local import free_port
from tests.gateways import own_state, replicas_of, rows_body
from tests.netns import Host, NamespacesUnavailable, namespace_host
from tests.services import haproxy_server
from tests.waiting import until
from tests.world import World, champion_copy, copy_home

pytestmark = pytest.mark.slow

MODEL = "fraud_geo"
NAME = "geo"
GATES = {"gate.quality": "pass", "gate.data": "pass", "feature_service": "fraud_v1"}
RUNTIME = frozenset(
    {"prefect", "prefect-server", "inference_log", "reports", "batch", "gateways", "prometheus", "logs"}
)
# shed_load false, as in the gateways' failover test: what is measured is the failover, and a replica slowed by the
# other tests of a CI run must not have its queue bound refuse the 17 clients
ENDPOINTS = f"""\
endpoints:
  - name: {NAME}
    config:
      served_entities:
        - entity_name: {MODEL}
          entity_alias: champion
          min_replicas: 1
          max_replicas: 1
          autoscaling:
            shed_load: false
"""


@dataclass
class Region:
    name: str
    host: Host
    home: Path
    port: int
    gateway: GatewayProcess | None = None

    @property
    def registry(self) -> str:
        return f"sqlite:///{self.home / 'mlflow.db'}"

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{self.port}"

    def start(self) -> None:
        env = environ_with(
            {
                "TOLLFREE_HOME": str(self.home),
                "MLFLOW_TRACKING_URI": self.registry,
                "TOLLFREE_WARM_POOL": "0",
                **own_state(self.home),
            }
        )
        log = self.home / "logs" / "gateway.log"
        self.gateway = start_gateway(
            env, log, host=self.host.address, port=self.port, timeout_s=240, runner=self.host.runner
        )

    def kill(self) -> None:
        assert self.gateway is not None
        self.gateway.process.kill()
        self.gateway.process.wait(timeout=30)


@pytest.fixture(scope="module")
def regions(world: World) -> Iterator[tuple[Region, Region]]:
    try:
        with namespace_host() as host_a, namespace_host() as host_b:
            made = []
            for name, host in (("a", host_a), ("b", host_b)):
                home = Path(tempfile.mkdtemp(prefix="tollfree-test-"))  # as long as the world's folder
                copy_home(world.home, home, RUNTIME)
                made.append(Region(name, host, home, free_port()))
            a, b = made
            try:
                yield a, b
            finally:
                for region in (a, b):
                    if region.gateway is not None:
                        children = replicas_of(region.gateway)
                        region.gateway.stop()
                        for child in children:
                            if child.is_running():
                                child.kill()
    except NamespacesUnavailable as exc:
        pytest.skip(str(exc))


def _register(registry: str, version_tags: dict[str, str]) -> str:
    """A new version of ``MODEL`` in ``registry`` from the world champion's files, made champion there."""
    return champion_copy(MlflowClient(registry, registry), MODEL, version_tags)


class ProxyLoad:
    """One closed-loop client through HAProxy: (sent, status; 0 for a transport error)."""

    def __init__(self, url: str, body: bytes) -> None:
        self.outcomes: list[tuple[float, int]] = []
        self._stop = threading.Event()
        headers = {**_auth(), "content-type": "application/json"}

        def one() -> None:
            with httpx.Client(headers=headers, timeout=10) as http:
                while not self._stop.is_set():
                    sent = time.time()
                    try:
                        status = http.post(f"{url}/serving-endpoints/{NAME}/invocations", content=body).status_code
                    except httpx.HTTPError:
                        status = 0
                    self.outcomes.append((sent, status))
                    time.sleep(0.02)

        self._thread = threading.Thread(target=one, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


class Load:
    """16 closed-loop clients through one failover client: (sent, answered, ok, the region's host or the error)."""

    def __init__(self, urls: list[str], body: bytes) -> None:
        from tollfree_client import AllRegionsFailed, FailoverClient

        self.client = FailoverClient(urls, os.environ["TOLLFREE_TOKEN"], timeout_s=3.0)
        self.outcomes: list[tuple[float, float, bool, str]] = []
        self._stop = threading.Event()
        headers = {"content-type": "application/json"}

        def one() -> None:
            while not self._stop.is_set():
                sent = time.time()
                try:
                    reply = self.client.request(
                        "POST", f"/serving-endpoints/{NAME}/invocations", content=body, headers=headers
                    )
                    ok, where = reply.status_code == 200, reply.url.host if reply.status_code == 200 else ""
                    where = where or f"{reply.url.host}: status {reply.status_code}"
                except (AllRegionsFailed, httpx.HTTPError) as exc:
                    ok, where = False, f"{type(exc).__name__}: {exc}"[:300]
                self.outcomes.append((sent, time.time(), ok, where))

        self._threads = [threading.Thread(target=one, daemon=True) for _ in range(16)]
        for thread in self._threads:
            thread.start()

    def answered_by(self, host: str, after: float) -> float | None:
        """When the first request sent after ``after`` was answered by ``host``, if one was."""
        times = [done for sent, done, ok, where in list(self.outcomes) if sent >= after and ok and where == host]
        return min(times) if times else None

    def failures(self) -> list[tuple[float, float, bool, str]]:
        return [o for o in list(self.outcomes) if not o[2]]

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)
        self.client.close()


def _proxied(proxy: ProxyLoad, after: float) -> int:
    """Requests through HAProxy sent after ``after`` and answered 200."""
    return sum(1 for t, code in list(proxy.outcomes) if t > after and code == 200)


def _first_answer(load: Load, region: Region, after: float, what: str) -> float:
    """Seconds from ``after`` to the first answer from ``region`` to a request sent since then (waited for)."""
    until(lambda: load.answered_by(region.host.address, after) is not None, what, 30, every_s=0.05)
    answered = load.answered_by(region.host.address, after)
    assert answered is not None
    return round(answered - after, 3)


def _compare_features(a: Region, b: Region) -> None:
    """Both regions' online stores agree on sampled entities; one entity changed in B's store is counted."""
    here, there = feature_store.open_store(a.home), feature_store.open_store(b.home)
    same = compare_regions(here, there, "fraud_v1", sample=50, seed=1)
    assert same.rows == 50 and same.mismatched() == [] and len(same.features) >= 3
    # the flow, from this process's state folder (the world's, which both regions copy)
    assert region_parity_main(["--other-home", str(b.home), "--sample", "20"]) == 0
    refs, _, sources = stored_features(there, "fraud_v1")
    view, feature = refs[0].split(":")
    key = there.get_feature_view(view).entity_columns[0].name
    first = sample_keys(here, sources, 50, 1)[key].iloc[0]  # an entity the comparison samples
    whole_view = [r for r in refs if r.startswith(f"{view}:")]
    row = there.get_online_features(features=whole_view, entity_rows=[{key: first}]).to_df()
    original = row.copy()
    row[feature] = row[feature] + 1
    timestamp = there.get_feature_view(view).batch_source.timestamp_field
    row[timestamp] = original[timestamp] = pd.Timestamp(datetime.now(UTC))
    there.write_to_online_store(view, row)
    changed = {f["feature"]: f["mismatches"] for f in compare_regions(here, there, "fraud_v1", 50, 1).table()}
    assert changed[feature] >= 1 and sum(changed.values()) == changed[feature], changed
    there.write_to_online_store(view, original)  # back as materialized: region B serves it below


def _apply(region: Region, path: Path) -> list[dict]:
    return apply_endpoints([str(path)], gateway_url=region.url, registry_uri=region.registry)


def test_two_regions_serve_one_file_fail_over_without_a_lost_request_and_follow_a_promotion(
    world: World, regions: tuple[Region, Region], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    a, b = regions
    _compare_features(a, b)
    _register(a.registry, GATES)
    (copied,) = replicate(MODEL, "champion", [b.registry], a.registry)
    assert copied["created"]
    file = tmp_path / "endpoints.yaml"
    file.write_text(ENDPOINTS)
    for region in (a, b):
        region.start()
        assert [c["action"] for c in _apply(region, file)] == ["create"]

    # the same file again: nothing changes, no replica restarts; a bad file: refused, nothing changes
    assert a.gateway is not None
    pids = {p.pid for p in replicas_of(a.gateway)}
    version = httpx.get(f"{a.url}/api/2.0/serving-endpoints/{NAME}", headers=_auth(), timeout=10).json()
    assert [c["action"] for c in _apply(a, file)] == ["unchanged"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(ENDPOINTS.replace("max_replicas: 1", "max_replicas: 1\n          max_replica: 3"))
    with pytest.raises(EndpointFileError, match=r"bad.yaml:9: .*max_replica: unknown field"):
        _apply(a, bad)
    missing = tmp_path / "missing.yaml"  # a valid endpoint, then one whose alias the registry lacks
    missing.write_text(
        ENDPOINTS.replace(f"name: {NAME}", "name: geo-new")
        + ENDPOINTS.split("endpoints:\n")[1].replace(f"name: {NAME}", "name: geo-bad").replace("champion", "nope")
    )
    with pytest.raises(LookupError, match="has no version with alias 'nope'"):
        _apply(a, missing)
    assert httpx.get(f"{a.url}/api/2.0/serving-endpoints/geo-new", headers=_auth(), timeout=10).status_code == 404
    after = httpx.get(f"{a.url}/api/2.0/serving-endpoints/{NAME}", headers=_auth(), timeout=10).json()
    assert after["config"]["config_version"] == version["config"]["config_version"]
    assert {p.pid for p in replicas_of(a.gateway)} == pids

    load = Load([a.url, b.url], rows_body(world))
    backup = f"{b.host.address}:{b.port}"
    proxy_cm = haproxy_server([f"{a.host.address}:{a.port}"], tmp_path / "haproxy", backups=[backup])
    (tmp_path / "haproxy").mkdir()
    proxy = ProxyLoad(proxy_cm.__enter__(), rows_body(world))
    try:
        until(lambda: load.answered_by(a.host.address, 0) is not None, "region A to answer", 60, every_s=0.1)
        figures: dict[str, float] = {}
        marks: dict[str, float] = {}
        for fault in ("kill", "partition"):
            time.sleep(1.0)  # load on A before the fault
            at = marks[fault] = time.time()
            if fault == "kill":
                a.kill()
            else:
                a.host.cut()
            figures[f"{fault}_to_b_s"] = _first_answer(load, b, at, "region B to answer")
            time.sleep(1.0)  # load on B
            if fault == "kill":  # through HAProxy too: B answers once A is out, while A is down
                until(lambda s=at + 1.5: _proxied(proxy, s) >= 20, "HAProxy to answer from region B", 30, every_s=0.1)
                proxy_failed = sum(1 for t, code in list(proxy.outcomes) if t >= at and code != 200)
                proxy_after = {code for t, code in list(proxy.outcomes) if t > at + 1.5}
                restarted = marks["kill restart"] = time.time()
                a.start()
            else:
                a.host.heal()
            back = marks[f"{fault} back"] = time.time()
            figures[f"{fault}_back_on_a_s"] = _first_answer(load, a, back, "back on region A")
            if fault == "kill":  # from the restart command, the gateway's own start included
                figures["kill_back_on_a_from_restart_s"] = round(figures["kill_back_on_a_s"] + back - restarted, 3)
    finally:
        load.stop()
        proxy.stop()
        proxy_cm.__exit__(None, None, None)
    figures["haproxy_failed_at_kill"] = proxy_failed
    assert proxy_after == {200}, proxy_after
    figures["requests"] = len(load.outcomes)
    start = min(o[0] for o in load.outcomes)
    timeline = {k: round(v - start, 2) for k, v in marks.items()}
    failed = [(round(o[0] - start, 2), round(o[1] - start, 2), o[3]) for o in load.failures()]
    record_property("regions_failover", figures)
    print(f"regions failover: {figures}")
    assert not failed, (len(failed), "faults at", timeline, "failures (sent, answered, what)", failed[:20])
    assert figures["kill_to_b_s"] < 1.0 and figures["partition_to_b_s"] < 1.0, (figures, timeline)
    assert figures["kill_back_on_a_from_restart_s"] < 10.0 and figures["partition_back_on_a_s"] < 10.0, (
        figures,
        timeline,
    )

    # a promotion in region A reaches region B's endpoint: replicated, then applied there
    promoted = _register(a.registry, GATES)
    (copied,) = replicate(MODEL, "champion", [b.registry], a.registry)
    assert copied["created"] and copied["alias_moved_from"] == "1"
    assert [c["action"] for c in _apply(b, file)] == ["update"]
    view = httpx.get(f"{b.url}/api/2.0/serving-endpoints/{NAME}", headers=_auth(), timeout=10).json()
    (entity,) = view["config"]["served_entities"]
    b_client = MlflowClient(b.registry, b.registry)
    assert b_client.get_model_version(MODEL, entity["entity_version"]).tags[VERIFIED_TAG] == copied["digest"]
    assert (
        b_client.get_model_version(MODEL, entity["entity_version"])
        .tags["replication.source"]
        .startswith(f"{MODEL}/{promoted}@")
    )
    reply = httpx.post(
        f"{b.url}/serving-endpoints/{NAME}/invocations",
        headers={**_auth(), "content-type": "application/json"},
        content=rows_body(world),
        timeout=30,
    )
    assert reply.status_code == 200, reply.text


def _auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}
