"""The Kubernetes backend through the official client, over HTTP, against the stand-in API server of
``tests/k8s_api.py`` (no real API server runs here: see that module for what it does and does not do).

What is real: the client's requests (paths, verbs, query, bodies, content types), the objects rendered from
the shipped template (validated in strict mode by the stand-in), the Role of ``infra/k8s/gateway-rbac.yaml``
(every request checked against it), the watch protocol (chunked events, resource versions, 410 Gone), and the
gateway app itself with its endpoint manager. What is not: the replicas (fake replies; the pod addresses are
loopback ports where nothing listens), scheduling, probes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from serving.endpoints.manager import EndpointManager
from serving.endpoints.store import EndpointStore
from serving.gateway.app import create_gateway_app
from serving.gateway.auth import Tokens
from serving.inference_log import InferenceLogWriter
from serving.replicas.cluster.api import ClusterError, DeploymentApi
from serving.replicas.cluster.connect import DEFAULT_TEMPLATE, Cluster, from_environ
from serving.replicas.cluster.objects import ReplicaTemplate, Wanted
from serving.replicas.cluster.routes import Routes, SliceWatch
from tests.fakes import FakeReplicas
from tests.k8s_api import FakeKubernetes, Pod, api_client, serve

TOKEN = "integration-test-admin-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NS = "tollfree"


def until(check: Callable[[], object], what: str, deadline_s: float = 20.0) -> object:
    deadline = time.monotonic() + deadline_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {deadline_s:.0f}s: {what}")
        time.sleep(0.02)


def stopped(client: TestClient, what: str, timeout_s: float = 60.0) -> None:
    """``client.__exit__`` (the app's lifespan shutdown), bounded: one that has not ended within ``timeout_s``
    fails naming the tasks still pending on the app's loop and where each waits, instead of hanging the run
    (and hiding the error that led to the exit)."""
    done = threading.Thread(target=client.__exit__, args=(None, None, None), daemon=True)
    done.start()
    done.join(timeout_s)
    if not done.is_alive():
        return

    async def pending() -> str:
        lines = []
        for task in asyncio.all_tasks():
            if task is asyncio.current_task():
                continue
            lines.append(f"{task.get_name()}:")
            awaited = task.get_coro()
            while awaited is not None:  # down the chain of awaits to where the task waits
                frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
                if frame is not None:
                    lines.append(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}")
                awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
        return "\n".join(lines)

    raise AssertionError(
        f"{what}: its shutdown had not ended after {timeout_s:.0f}s; pending tasks:\n" + client.portal.call(pending)
    )


@pytest.fixture()
def api() -> Iterator[tuple[FakeKubernetes, str]]:
    cluster = FakeKubernetes(namespace=NS)
    with serve(cluster) as url:
        yield cluster, url


@pytest.fixture()
def backend(api) -> tuple[DeploymentApi, FakeKubernetes]:
    fake, url = api
    return DeploymentApi(NS, ReplicaTemplate.load(DEFAULT_TEMPLATE), api_client(url)), fake


@pytest.fixture()
def watched(api) -> Iterator[tuple[Routes, SliceWatch]]:
    """The routing and its EndpointSlice watch against the stand-in, stopped after the test."""
    routes = Routes(NS)
    watch = SliceWatch(NS, routes, api_client(api[1]))
    watch.start()
    yield routes, watch
    watch.stop()


def test_apply_creates_a_valid_deployment_service_and_budget_owned_by_it(backend):
    cluster, fake = backend
    wanted = Wanted("fraud", "champion", "models:/fraud/3", "Large")
    assert cluster.apply(wanted, 2) == 2
    assert fake.deployments() == {wanted.name: 2} and not fake.refused
    assert fake.kinds(wanted.name) == {"Deployment", "Service", "PodDisruptionBudget"}
    calls = [call for call, _, _ in fake.requests]
    assert calls == [
        f"POST /apis/apps/v1/namespaces/{NS}/deployments",
        f"POST /api/v1/namespaces/{NS}/services",
        f"POST /apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
    ]
    deployment = fake.get("Deployment", wanted.name)[1]
    for kind in ("Service", "PodDisruptionBudget"):
        [owner] = fake.get(kind, wanted.name)[1]["metadata"]["ownerReferences"]
        assert owner["uid"] == deployment["metadata"]["uid"] and owner["kind"] == "Deployment"
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "4"
    assert {"secretRef": {"name": "tollfree-replica-token"}} in container["envFrom"]  # the token, from the Secret


def test_apply_adopts_an_existing_deployment_and_never_scales_it_down(backend):
    cluster, fake = backend
    wanted = Wanted("fraud", "champion", "models:/fraud/3")
    cluster.apply(wanted, 1)
    cluster.scale(wanted.name, 4)  # what the autoscaler had asked for before a gateway restart
    uid = fake.get("Deployment", wanted.name)[1]["metadata"]["uid"]
    assert cluster.apply(wanted, 2) == 4
    assert fake.deployments() == {wanted.name: 4} and fake.get("Deployment", wanted.name)[1]["metadata"]["uid"] == uid
    assert cluster.apply(wanted, 6) == 6 and fake.deployments() == {wanted.name: 6}


def test_scale_patches_the_subresource_only_when_the_count_differs(backend):
    cluster, fake = backend
    wanted = Wanted("fraud", "champion", "models:/fraud/3")
    cluster.apply(wanted, 2)
    fake.requests.clear()
    cluster.scale(wanted.name, 2)
    cluster.scale(wanted.name, 5)
    path = f"/apis/apps/v1/namespaces/{NS}/deployments/{wanted.name}/scale"
    assert fake.requests == [
        (f"GET {path}", "", None),
        (f"GET {path}", "", None),
        (f"PATCH {path}", "application/merge-patch+json", {"spec": {"replicas": 5}}),
    ]
    with pytest.raises(ClusterError, match=r"scale Deployment tollfree-nope-1-\w+ to 1 failed with HTTP 404"):
        cluster.scale(Wanted("nope", "1", "models:/m/1").name, 1)


def test_delete_takes_the_owned_service_and_budget_with_it_and_lists_only_what_the_gateways_manage(backend):
    cluster, fake = backend
    keep, drop = Wanted("a", "x", "models:/m/1"), Wanted("b", "y", "models:/m/1")
    cluster.apply(keep, 1)
    cluster.apply(drop, 1)
    fake.create(
        "Deployment",
        {**fake.get("Deployment", keep.name)[1], "metadata": {"name": "someone-elses", "labels": {"app": "x"}}},
    )
    assert sorted(cluster.managed()) == sorted([keep.name, drop.name])
    cluster.delete(drop.name)
    cluster.delete(drop.name)  # gone already: fine
    assert fake.kinds(drop.name) == set() and fake.kinds(keep.name) == {"Deployment", "Service", "PodDisruptionBudget"}


def test_a_refused_request_names_the_call_and_status_never_the_body(api):
    fake, url = api
    fake.rules = [r for r in fake.rules if r["resources"] != ["deployments"]]  # a Role without create on Deployments
    cluster = DeploymentApi(NS, ReplicaTemplate.load(DEFAULT_TEMPLATE), api_client(url))
    with pytest.raises(ClusterError) as refused:
        cluster.apply(Wanted("fraud", "champion", "models:/fraud/3"), 1)
    assert "create Deployment tollfree-fraud-champion-" in str(refused.value) and "HTTP 403" in str(refused.value)
    assert "models:/fraud/3" not in str(refused.value)


def test_the_watch_routes_to_ready_pods_follows_changes_and_lists_afresh_after_410(backend, watched):
    cluster, fake = backend
    routes, watch = watched
    assert routes.synced.wait(10)
    wanted = Wanted("fraud", "champion", "models:/fraud/3")
    cluster.apply(wanted, 2)
    two = until(lambda: len(routes.pods(wanted.name)) == 2 and routes.pods(wanted.name), "two pods routed")
    assert len({p.url for p in two}) == 2 and {p.pod for p in two} == {p.name for p in fake.running[wanted.name]}
    fake.set_ready(wanted.name, 0, False)  # failing its readiness probe: out of the routing
    until(lambda: len(routes.pods(wanted.name)) == 1, "the unready pod dropped")
    fake.expire_watches()  # the API server restarted after a compaction
    cluster.scale(wanted.name, 3)
    until(lambda: len(routes.pods(wanted.name)) == 2 and watch.relists == 2, "a fresh list after 410 Gone")
    cluster.delete(wanted.name)
    until(lambda: routes.pods(wanted.name) == [], "the deleted entity's pods dropped")
    assert not fake.refused


def test_the_role_grants_exactly_what_the_backend_uses(backend, watched):
    """Least privilege: every verb on every resource in the Role is one the backend or the watch sends."""
    cluster, fake = backend
    wanted = Wanted("fraud", "champion", "models:/fraud/3")
    cluster.apply(wanted, 1)
    cluster.apply(wanted, 2)
    cluster.managed()
    cluster.delete(wanted.name)
    until(lambda: ("watch", "endpointslices") in fake.used, "a watch")
    granted = {(verb, resource) for rule in fake.rules for resource in rule["resources"] for verb in rule["verbs"]}
    used = set(fake.used)
    assert used == granted, f"granted but unused: {granted - used}; used but not granted: {used - granted}"


def _gateway(home: Path, url: str, replicas: FakeReplicas):  # type: ignore[no-untyped-def]
    cluster: Cluster = from_environ(
        {"TOLLFREE_REPLICA_TOKEN": "replica-token", "TOLLFREE_K8S_NAMESPACE": NS}, api_client=api_client(url)
    )
    manager = EndpointManager(
        EndpointStore(home / "endpoints.db"),
        lambda model, version, alias: version or "1",
        {},
        home / "logs",
        replica_client=replicas,
        cluster=cluster,
        ready_timeout_s=20,
    )
    tokens = Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN})
    return create_gateway_app(manager, tokens, InferenceLogWriter(home / "log")), manager


def _view(client: TestClient) -> dict:
    return client.get("/api/2.0/serving-endpoints/ep", headers=AUTH).json()


def test_a_gateway_on_kubernetes_serves_from_pods_scales_the_deployment_and_leaves_it_to_the_next_start(api, tmp_path):
    fake, url = api
    replicas = FakeReplicas(delay_s=0.0)
    app, manager = _gateway(tmp_path, url, replicas)
    body = {
        "name": "ep",
        "config": {"served_entities": [{"entity_name": "m", "entity_version": "1", "min_replicas": 1}]},
    }
    with TestClient(app) as client:
        assert client.post("/api/2.0/serving-endpoints", json=body, headers=AUTH).status_code == 200
        until(lambda: _view(client)["state"]["ready"] == "READY", "the endpoint ready on its pod")
        [name] = fake.deployments()
        answer = client.post("/serving-endpoints/ep/invocations", json={"inputs": [[1.0]]}, headers=AUTH)
        assert answer.status_code == 200, answer.text
        [pod] = manager.replica_set("ep", "m-1").replicas
        assert replicas.batches[-1][0] == pod.url and pod.pod.startswith(name)

        client.portal.call(manager.replica_set("ep", "m-1").scale_to, 3)  # what the autoscaler calls
        until(lambda: fake.deployments() == {name: 3}, "the Deployment scaled through its scale subresource")
        until(lambda: manager.replica_set("ep", "m-1").ready_count() == 3, "three pods routed")
        assert manager.replica_set("ep", "m-1").starting == 0
    assert fake.deployments() == {name: 3}, "a stopping gateway leaves the Deployment to the cluster"

    fake.requests.clear()
    app, manager = _gateway(tmp_path, url, replicas)
    with TestClient(app) as client:
        until(lambda: _view(client)["state"]["ready"] == "READY", "the restored endpoint ready")
        assert manager.replica_set("ep", "m-1").ready_count() == 3  # adopted: its three pods, none started anew
        assert fake.deployments() == {name: 3}
        posts = [c for c, _, _ in fake.requests if c.startswith("POST")]
        assert posts == [
            f"POST /apis/apps/v1/namespaces/{NS}/deployments",
            f"POST /api/v1/namespaces/{NS}/services",
            f"POST /apis/policy/v1/namespaces/{NS}/poddisruptionbudgets",
        ]  # each answered 409: there
        update = {"served_entities": [{"entity_name": "m", "entity_version": "2", "min_replicas": 1}]}
        assert client.put("/api/2.0/serving-endpoints/ep/config", json=update, headers=AUTH).status_code == 200
        until(lambda: _view(client)["state"]["config_update"] == "NOT_UPDATING", "the new version rolled out")
        [new] = fake.deployments()
        assert new != name and fake.kinds(name) == set(), "the old version's Deployment deleted once traffic moved"
        assert client.delete("/api/2.0/serving-endpoints/ep", headers=AUTH).status_code == 200
        assert fake.deployments() == {}
    assert not fake.refused


def test_two_gateways_on_one_store_route_to_the_same_pods_and_a_new_leader_adopts_the_deployment(
    api, postgres, tmp_path
):
    """Several gateways (a real PostgreSQL store and lease): the follower routes to the pods it reads from the
    EndpointSlices itself; when the leader stops, the follower leads on the same Deployment, none made anew."""
    fake, url = api
    state = postgres.url(postgres.new_database())
    gateways = []
    for name in ("a", "b"):
        cluster = from_environ(
            {"TOLLFREE_REPLICA_TOKEN": "replica-token", "TOLLFREE_K8S_NAMESPACE": NS}, api_client=api_client(url)
        )
        replicas = FakeReplicas(delay_s=0.0)
        manager = EndpointManager(
            EndpointStore(state),
            lambda model, version, alias: version or "1",
            {},
            tmp_path / name / "logs",
            replica_client=replicas,
            cluster=cluster,
            ready_timeout_s=20,
        )
        app = create_gateway_app(
            manager, Tokens.from_environ({"TOLLFREE_TOKEN": TOKEN}), InferenceLogWriter(tmp_path / name / "log")
        )
        gateways.append((app, manager, replicas))
    (app_a, leader, _), (app_b, follower, follower_replicas) = gateways
    body = {
        "name": "ep",
        "config": {"served_entities": [{"entity_name": "m", "entity_version": "1", "min_replicas": 2}]},
    }
    a: TestClient | None = TestClient(app_a).__enter__()  # the first to start leads
    try:
        until(lambda: leader.leading, "gateway a leads")
        b = TestClient(app_b).__enter__()
        try:
            assert not follower.leading
            assert b.post("/api/2.0/serving-endpoints", json=body, headers=AUTH).status_code == 200  # via the follower
            until(lambda: _view(a)["state"]["ready"] == "READY", "ready through the leader's rollout")
            [name] = fake.deployments()
            until(
                lambda: (s := follower.replica_set("ep", "m-1")) is not None and s.ready_count() == 2,
                "the follower routes to both pods",
            )
            pods = {p.url for p in leader.replica_set("ep", "m-1").replicas}
            assert {p.url for p in follower.replica_set("ep", "m-1").replicas} == pods
            assert follower.replica_set("ep", "m-1").starting == 0  # a follower declares nothing
            answer = b.post("/serving-endpoints/ep/invocations", json={"inputs": [[1.0]]}, headers=AUTH)
            assert answer.status_code == 200, answer.text
            assert follower_replicas.batches[-1][0] in pods

            fake.requests.clear()
            leaving, a = a, None
            stopped(leaving, "gateway a")  # the leader stops (its lease is released)
            until(
                lambda: follower.leading and (s := follower.replica_set("ep", "m-1")) is not None and not s.followed,
                "the follower leads and runs the entity",
                deadline_s=30,
            )
            assert fake.deployments() == {name: 2}
            assert not [c for c, _, _ in fake.requests if c.startswith(("DELETE", "PATCH"))]
            assert {p.url for p in follower.replica_set("ep", "m-1").replicas} == pods
            answer = b.post("/serving-endpoints/ep/invocations", json={"inputs": [[1.0]]}, headers=AUTH)
            assert answer.status_code == 200, answer.text
        finally:
            stopped(b, "gateway b")
    finally:
        if a is not None:
            stopped(a, "gateway a")
    assert fake.deployments() == {name: 2} and not fake.refused


class _ReadyPod:
    """A pod that answers only its readiness probe, with the batching plan its replica would have measured."""

    def __init__(self) -> None:
        import http.server
        import threading

        plan = {"enabled": True, "max_batch": 8, "max_wait_ms": 2.0, "single_ms": 1.5, "gain": 3.0}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"status": "ready", "batching": plan}).encode()
                self.send_response(200 if self.path == "/health/ready" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __call__(self, name: str, container: dict) -> Pod:
        return Pod(name, "127.0.0.1", self.server.server_address[1])


def test_the_batching_plan_comes_from_a_pods_ready_answer(tmp_path):
    pod = _ReadyPod()
    fake = FakeKubernetes(namespace=NS, pods=pod)
    try:
        with serve(fake) as url:
            app, manager = _gateway(tmp_path, url, FakeReplicas(delay_s=0.0))
            body = {"name": "ep", "config": {"served_entities": [{"entity_name": "m", "entity_version": "1"}]}}
            with TestClient(app) as client:
                assert client.post("/api/2.0/serving-endpoints", json=body, headers=AUTH).status_code == 200
                until(lambda: _view(client)["state"]["ready"] == "READY", "ready")
                plan = until(
                    lambda: (
                        manager.replica_set("ep", "m-1").dispatcher.plan.enabled
                        and manager.replica_set("ep", "m-1").dispatcher.plan
                    ),
                    "the pod's batching plan adopted",
                )
                assert plan.max_batch == 8 and plan.single_ms == 1.5
    finally:
        pod.server.shutdown()
