"""A stand-in for the Kubernetes API server, over real HTTP on loopback, for the calls tollfree's Kubernetes
backend makes (no API server can run on these machines).

It answers as the API server does for those paths, verbs and bodies: Deployments (create, get, list by label,
delete with the Service and budget they own), their scale subresource, Services, PodDisruptionBudgets, and
EndpointSlices (list, and watch as a chunked stream of JSON events from a resource version, 410 Gone for one
too old). Every object created is validated against the Kubernetes schemas in strict mode (422 otherwise),
and every request is checked against the Role in ``infra/k8s/gateway-rbac.yaml`` (403 otherwise). What it
does not do: scheduling, images, the pod spec beyond the container's command. Its "kubelet" gives each pod of
a Deployment what ``pods`` makes of it (default: a loopback port where nothing listens, ready at once;
``LocalPods``: a real replica process on loopback, ready when its ``/health/ready`` answers 200, as the
template's readiness probe asks), and its EndpointSlice controller publishes the ready pods of each Service in
one slice per pod (each slice has its own port), with the Service's labels.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
import yaml
from kubernetes_validate import utils as kv
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serving.replicas.local import free_port

RBAC = Path(__file__).resolve().parents[1] / "infra" / "k8s" / "gateway-rbac.yaml"
KUBERNETES_VERSION = "1.37.0"

PodFactory = Callable[[str, dict[str, Any]], "Pod"]  # (pod name, container) -> the pod


def _role_rules() -> list[dict[str, Any]]:
    [role] = [d for d in yaml.safe_load_all(RBAC.read_text()) if d and d["kind"] == "Role"]
    return role["rules"]


@dataclass
class Pod:
    name: str
    address: str
    port: int
    ready: bool = True
    probe: Callable[[], bool] | None = None  # the readiness probe (None: ready as made)
    stop: Callable[[], None] | None = None  # what deleting the pod does


def made_up_address() -> PodFactory:
    """A loopback port nothing listens on, per pod: a gateway that reaches out to it is refused at once."""

    def pod(name: str, container: dict[str, Any]) -> Pod:
        return Pod(name, "127.0.0.1", free_port())

    return pod


class LocalPods:
    """Each pod a real ``python -m serving.replica_server`` process on 127.0.0.1 (the model from the container's
    ``--model-uri``), with ``env`` (where the Secret's token goes)."""

    def __init__(self, env: dict[str, str], log_dir: Path) -> None:
        self.env = env
        self.log_dir = log_dir
        self.started: list[Any] = []

    def __call__(self, name: str, container: dict[str, Any]) -> Pod:
        import httpx

        from serving.replicas.local import start_replica, stop_replica

        command = container["command"]
        replica = start_replica(command[command.index("--model-uri") + 1], self.log_dir, self.env)
        self.started.append(replica)

        def probe() -> bool:
            try:
                return replica.alive() and httpx.get(f"{replica.url}/health/ready", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        return Pod(name, replica.host, replica.port, ready=False, probe=probe, stop=lambda: stop_replica(replica))


@dataclass
class FakeKubernetes:
    namespace: str = "tollfree"
    pods: PodFactory = field(default_factory=made_up_address)
    objects: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) -> object
    running: dict[str, list[Pod]] = field(default_factory=dict)  # Deployment -> pods
    requests: list[tuple[str, str, dict[str, Any] | None]] = field(default_factory=list)
    events: list[tuple[int, str, dict[str, Any]]] = field(default_factory=list)  # slice events, by version
    refused: list[str] = field(default_factory=list)
    used: set[tuple[str, str]] = field(default_factory=set)  # (verb, resource) asked for
    oldest_version: int = 0  # a watch from before this gets 410 Gone
    generation: int = 0  # bumped to end every open watch (as an API server restart does)
    version: int = 100
    lock: threading.Condition = field(default_factory=threading.Condition)
    rules: list[dict[str, Any]] = field(default_factory=_role_rules)

    # ---- what tests read and do ----------------------------------------------------------------
    def deployments(self) -> dict[str, int]:
        with self.lock:
            return {n: o["spec"]["replicas"] for (k, n), o in self.objects.items() if k == "Deployment"}

    def kinds(self, name: str) -> set[str]:
        with self.lock:
            return {k for (k, n) in self.objects if n == name}

    def set_ready(self, deployment: str, index: int, ready: bool) -> None:
        with self.lock:
            self.running[deployment][index].ready = ready
            self._publish_slices()

    def probe_pods(self) -> None:
        """One round of readiness probes (the pods' own, outside the lock)."""
        with self.lock:
            probed = [pod for pods in self.running.values() for pod in pods if pod.probe is not None]
        results = [(pod, pod.probe()) for pod in probed]  # type: ignore[misc]
        with self.lock:
            changed = [pod for pod, ready in results if pod.ready != ready]
            for pod, ready in results:
                pod.ready = ready
            if changed:
                self._publish_slices()

    def expire_watches(self) -> None:
        """An API server restart after a compaction: every open watch ends, and one resuming from before now
        gets 410 Gone. The resource version moves on, so a fresh list returns one a watch can resume from, as
        a real API server's does (a list whose version were already too old would send its client round a
        loop of lists and 410s)."""
        with self.lock:
            self.version += 1
            self.oldest_version = self.version  # what every client has seen is too old to resume from
            self.generation += 1
            self.lock.notify_all()

    # ---- the API -------------------------------------------------------------------------------
    def allowed(self, verb: str, group: str, resource: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in self.rules)

    def _next_version(self) -> str:
        self.version += 1
        return str(self.version)

    def create(self, kind: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            kv.validate(body, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as exc:
            return 422, _status(422, "Invalid", f"{kind} is invalid: {exc.message}")
        name = body["metadata"]["name"]
        with self.lock:
            if (kind, name) in self.objects:
                return 409, _status(409, "AlreadyExists", f'{kind.lower()}s "{name}" already exists')
            obj = copy.deepcopy(body)
            obj["metadata"].update(
                namespace=self.namespace, uid=str(uuid.uuid4()), resourceVersion=self._next_version()
            )
            self.objects[(kind, name)] = obj
            if kind == "Deployment":
                self._reconcile(name)
            self._publish_slices()
            return 201, obj

    def get(self, kind: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            obj = self.objects.get((kind, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            return 200, copy.deepcopy(obj)

    def delete(self, kind: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            if self.objects.pop((kind, name), None) is None:
                return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            for key, obj in list(self.objects.items()):  # the garbage collector: what it owned goes with it
                if any(
                    ref.get("name") == name and ref.get("kind") == kind
                    for ref in obj["metadata"].get("ownerReferences", [])
                ):
                    del self.objects[key]
            self._stop_pods(self.running.pop(name, []))
            self._publish_slices()
            return 200, _status(200, "", "", status="Success")

    def scale(self, name: str, replicas: int | None) -> tuple[int, dict[str, Any]]:
        with self.lock:
            obj = self.objects.get(("Deployment", name))
            if obj is None:
                return 404, _status(404, "NotFound", f'deployments.apps "{name}" not found')
            if replicas is not None:
                obj["spec"]["replicas"] = replicas
                obj["metadata"]["resourceVersion"] = self._next_version()
                self._reconcile(name)
                self._publish_slices()
            return 200, {
                "apiVersion": "autoscaling/v1",
                "kind": "Scale",
                "metadata": {
                    "name": name,
                    "namespace": self.namespace,
                    "resourceVersion": obj["metadata"]["resourceVersion"],
                },
                "spec": {"replicas": obj["spec"]["replicas"]},
                "status": {"replicas": len(self.running.get(name, [])), "selector": ""},
            }

    def list(self, kind: str, selector: str | None) -> dict[str, Any]:
        wanted = dict(part.split("=", 1) for part in selector.split(",")) if selector else {}
        with self.lock:
            items = [
                copy.deepcopy(o)
                for (k, _), o in sorted(self.objects.items())
                if k == kind and wanted.items() <= o["metadata"].get("labels", {}).items()
            ]
            return {
                "apiVersion": "v1",
                "kind": f"{kind}List",
                "metadata": {"resourceVersion": str(self.version)},
                "items": items,
            }

    def watch(self, since: int, selector: str | None, stop: threading.Event, timeout_s: float) -> Iterator[bytes]:
        wanted = dict(part.split("=", 1) for part in selector.split(",")) if selector else {}
        deadline = time.monotonic() + timeout_s
        seen = since
        generation = self.generation
        while not stop.is_set() and time.monotonic() < deadline and generation == self.generation:
            with self.lock:  # never yield while holding it: the next item may be asked for on another thread
                expired = seen < self.oldest_version
                fresh = [] if expired else [(v, t, o) for v, t, o in self.events if v > seen]
                if not expired and not fresh:
                    self.lock.wait(0.05)
                    continue
            if expired:
                yield (
                    json.dumps(
                        {"type": "ERROR", "object": _status(410, "Expired", "too old resource version")}
                    ).encode()
                    + b"\n"
                )
                return
            for v, kind, obj in fresh:
                seen = v
                if wanted.items() <= obj["metadata"].get("labels", {}).items():
                    yield json.dumps({"type": kind, "object": obj}).encode() + b"\n"

    # ---- the controllers -----------------------------------------------------------------------
    def _reconcile(self, name: str) -> None:
        """The Deployment's pods: as many as it asks for, the newest ones removed first."""
        obj = self.objects[("Deployment", name)]
        pods = self.running.setdefault(name, [])
        container = obj["spec"]["template"]["spec"]["containers"][0]
        while len(pods) < obj["spec"]["replicas"]:
            pod_name = f"{name}-{uuid.uuid4().hex[:5]}"
            pods.append(self.pods(pod_name, container))
        self._stop_pods(pods[obj["spec"]["replicas"] :])
        del pods[obj["spec"]["replicas"] :]

    @staticmethod
    def _stop_pods(pods: list[Pod]) -> None:
        for pod in pods:
            if pod.stop is not None:
                threading.Thread(target=pod.stop, daemon=True).start()

    def _publish_slices(self) -> None:
        """One EndpointSlice per pod of each Service's pods (labels copied from the Service); events for changes."""
        wanted: dict[str, dict[str, Any]] = {}
        for (kind, svc), service in self.objects.items():
            if kind != "Service":
                continue
            selector = service["spec"].get("selector", {})
            for (k, dep), deployment in self.objects.items():
                if (
                    k != "Deployment"
                    or not selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
                ):
                    continue
                for pod in self.running.get(dep, []):
                    labels = {
                        **service["metadata"].get("labels", {}),
                        "kubernetes.io/service-name": svc,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    }
                    wanted[f"{pod.name}-slice"] = {
                        "apiVersion": "discovery.k8s.io/v1",
                        "kind": "EndpointSlice",
                        "addressType": "IPv4",
                        "metadata": {"name": f"{pod.name}-slice", "namespace": self.namespace, "labels": labels},
                        "endpoints": [
                            {
                                "addresses": [pod.address],
                                "conditions": {"ready": pod.ready, "serving": pod.ready, "terminating": False},
                                "targetRef": {"kind": "Pod", "name": pod.name, "namespace": self.namespace},
                            }
                        ],
                        "ports": [{"name": "http", "port": pod.port, "protocol": "TCP"}],
                    }
        current = {n: o for (k, n), o in self.objects.items() if k == "EndpointSlice"}
        for name in set(current) - set(wanted):
            obj = self.objects.pop(("EndpointSlice", name))
            obj["metadata"]["resourceVersion"] = self._next_version()
            self.events.append((self.version, "DELETED", obj))
        for name, obj in wanted.items():
            old = current.get(name)
            if old is not None and old["endpoints"] == obj["endpoints"]:
                continue
            obj["metadata"]["resourceVersion"] = self._next_version()
            self.objects[("EndpointSlice", name)] = obj
            self.events.append((self.version, "MODIFIED" if old else "ADDED", copy.deepcopy(obj)))
        self.lock.notify_all()


def _status(code: int, reason: str, message: str, status: str = "Failure") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Status", "status": status, "code": code, "reason": reason, "message": message}


_KINDS = {
    "deployments": ("Deployment", "apps"),
    "services": ("Service", ""),
    "endpointslices": ("EndpointSlice", "discovery.k8s.io"),
    "poddisruptionbudgets": ("PodDisruptionBudget", "policy"),
}
_VERBS = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}


def app(cluster: FakeKubernetes, stop: threading.Event) -> Starlette:
    async def handle(request: Request) -> Response:
        params = request.path_params
        resource, name, sub = params["resource"], params.get("name"), params.get("sub")
        if params["ns"] != cluster.namespace or resource not in _KINDS or sub not in (None, "scale"):
            cluster.refused.append(f"{request.method} {request.url.path}")
            return JSONResponse(_status(404, "NotFound", "the server could not find the requested resource"), 404)
        kind, group = _KINDS[resource]
        query = request.query_params
        verb = _VERBS.get(request.method) or ("watch" if query.get("watch") == "true" else "get" if name else "list")
        body = json.loads(await request.body() or b"null")
        cluster.requests.append((f"{request.method} {request.url.path}", request.headers.get("content-type", ""), body))
        cluster.used.add((verb, f"{resource}/{sub}" if sub else resource))
        if not cluster.allowed(verb, group, f"{resource}/{sub}" if sub else resource):
            cluster.refused.append(f"{verb} {resource}")
            return JSONResponse(_status(403, "Forbidden", f"cannot {verb} resource {resource}"), 403)
        if verb == "watch":
            events = cluster.watch(
                int(query.get("resourceVersion") or 0),
                query.get("labelSelector"),
                stop,
                float(query.get("timeoutSeconds") or 300),
            )
            return StreamingResponse(_in_thread(events), media_type="application/json")
        if verb == "list":
            return JSONResponse(cluster.list(kind, query.get("labelSelector")))
        if sub == "scale":
            status, out = cluster.scale(name, body["spec"]["replicas"] if verb == "patch" else None)
        elif verb == "create":
            status, out = cluster.create(kind, body)
        elif verb == "delete":
            status, out = cluster.delete(kind, name)
        else:
            status, out = cluster.get(kind, name)
        return JSONResponse(out, status)

    prefix = "/apis/{group:path}/namespaces/{ns}/{resource}"
    routes = [
        Route(path, handle, methods=["GET", "POST", "PATCH", "DELETE"])
        for base in (prefix, "/api/v1/namespaces/{ns}/{resource}")
        for path in (base, base + "/{name}", base + "/{name}/{sub}")
    ]
    return Starlette(routes=routes)


async def _in_thread(events: Iterator[bytes]):  # type: ignore[no-untyped-def]
    """The blocking event iterator, one item at a time off the loop."""
    loop = asyncio.get_running_loop()
    done = object()
    while True:
        item = await loop.run_in_executor(None, next, events, done)
        if item is done:
            return
        yield item


@contextmanager
def serve(cluster: FakeKubernetes) -> Iterator[str]:
    """The fake API server on a free loopback port; yields its URL."""
    stop = threading.Event()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app(cluster, stop), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def kubelet() -> None:
        while not stop.wait(0.2):
            cluster.probe_pods()

    threading.Thread(target=kubelet, daemon=True).start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake Kubernetes API server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        with cluster.lock:
            cluster.lock.notify_all()
            for pods in cluster.running.values():
                for pod in pods:
                    if pod.stop is not None:
                        pod.stop()
        server.should_exit = True
        thread.join(10)


def api_client(url: str):  # type: ignore[no-untyped-def]
    from kubernetes import client as k8s

    return k8s.ApiClient(k8s.Configuration(host=url))
