"""Every gateway's routing on Kubernetes: the ready pods of each served entity, read from EndpointSlices.

One list-then-watch over the namespace's EndpointSlices labelled ``app.kubernetes.io/managed-by=
tollfree-gateway`` (the EndpointSlice controller copies a Service's labels onto its slices) covers every
entity. A pod is routed to while its endpoint's ``conditions.ready`` is not false (unset means ready, as
kube-proxy reads it) and it is not terminating; an entity's pods are the union of its slices. The watch
resumes from the last resource version it saw, lists afresh when the server answers 410 Gone, and backs
off after any other failure; the routing it has stays in use meanwhile.

Slices are read as plain JSON (``Watch(return_type="object")``, lists unparsed): the client's models reject a
slice whose ``endpoints`` is null, which the API server sends for a Service with no pod yet.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from serving.replicas.cluster.objects import MANAGED_SELECTOR
from serving.traffic.replica import pod_id

log = logging.getLogger(__name__)

SERVICE_LABEL = "kubernetes.io/service-name"
WATCH_TIMEOUT_S = 300  # the server ends a watch after this long; the next one resumes where it stopped
BACKOFF_S = (0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class PodReplica:
    """A ready pod of an entity (a ``serving.traffic.replica.Replica``): an address to route to. The cluster
    runs it, so it is alive while the slices list it (``alive`` is always true; the routing drops it when a
    slice does)."""

    host: str
    port: int
    pod: str
    namespace: str
    outstanding: int = field(default=0)

    @property
    def id(self) -> str:
        return pod_id(self.namespace, self.pod)

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    @property
    def pid(self) -> None:
        """Its process is in a pod, on a node of the cluster: none to read here."""
        return None

    def alive(self) -> bool:
        return True


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def ready_pods(slice_: Mapping[str, Any]) -> list[tuple[str, int, str]]:
    """``(address, port, pod name)`` of each ready, not terminating endpoint of one EndpointSlice."""
    ports = [p for p in slice_.get("ports") or [] if p.get("port")]
    port = next((p["port"] for p in ports if p.get("name") == "http"), ports[0]["port"] if ports else None)
    if port is None:
        return []
    out = []
    for endpoint in slice_.get("endpoints") or []:
        conditions = endpoint.get("conditions") or {}
        if conditions.get("ready") is False or conditions.get("terminating") is True:
            continue
        addresses = endpoint.get("addresses") or []
        if addresses:
            pod = (endpoint.get("targetRef") or {}).get("name") or addresses[0]
            out.append((addresses[0], int(port), pod))
    return out


class Routes:
    """The ready pods of ``namespace`` by Service (= replica-set) name; the sets that route to them subscribe by
    name."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._slices: dict[str, tuple[str, list[tuple[str, int, str]]]] = {}  # slice -> (service, pods)
        self._pods: dict[str, list[PodReplica]] = {}
        self._subscribers: dict[str, list[Callable[[list[PodReplica]], None]]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()  # the first list arrived

    def pods(self, name: str) -> list[PodReplica]:
        with self._lock:
            return list(self._pods.get(name, []))

    def subscribe(self, name: str, on_change: Callable[[list[PodReplica]], None]) -> None:
        """``on_change`` gets the entity's pods now and whenever they change (on the watch's thread, or the
        event loop's if ``Routes`` is driven from it: the caller hands it over, see ``PodSet``)."""
        with self._lock:
            self._subscribers.setdefault(name, []).append(on_change)
            pods = list(self._pods.get(name, []))
        on_change(pods)

    def unsubscribe(self, name: str, on_change: Callable[[list[PodReplica]], None]) -> None:
        with self._lock:
            listeners = self._subscribers.get(name, [])
            if on_change in listeners:
                listeners.remove(on_change)

    def replace(self, slices: list[Mapping[str, Any]]) -> None:
        """A fresh list: every slice known is one of these."""
        with self._lock:
            self._slices = {}
        for slice_ in slices:
            self.event("ADDED", slice_, publish=False)
        self._publish(None)
        self.synced.set()

    def event(self, kind: str, slice_: Mapping[str, Any], *, publish: bool = True) -> None:
        meta = slice_.get("metadata") or {}
        key, service = meta.get("name"), (meta.get("labels") or {}).get(SERVICE_LABEL)
        if not key or not service:
            return
        with self._lock:
            before = self._slices.get(key)
            if kind == "DELETED":
                self._slices.pop(key, None)
            else:
                self._slices[key] = (service, ready_pods(slice_))
        if publish:
            self._publish({service} | ({before[0]} if before else set()))

    def _publish(self, services: set[str] | None) -> None:
        with self._lock:
            grouped: dict[str, list[tuple[str, int, str]]] = {}
            for service, pods in self._slices.values():
                grouped.setdefault(service, []).extend(pods)
            changed = set(grouped) | set(self._pods) if services is None else services
            calls = []
            for service in changed:
                known = {p.url: p for p in self._pods.get(service, [])}
                fresh = sorted({(h, p, n) for h, p, n in grouped.get(service, [])})
                routed = [known.get(_url(h, p)) or PodReplica(h, p, n, self.namespace) for h, p, n in fresh]
                if [p.url for p in routed] == [p.url for p in self._pods.get(service, [])]:
                    continue
                self._pods[service] = routed
                calls += [(listener, list(routed)) for listener in self._subscribers.get(service, [])]
        for listener, routed in calls:
            listener(routed)


class SliceWatch:
    """Keeps ``routes`` in step with the namespace's EndpointSlices, on a thread of its own."""

    def __init__(
        self,
        namespace: str,
        routes: Routes,
        api_client: k8s.ApiClient | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.namespace = namespace
        self.routes = routes
        self.discovery = k8s.DiscoveryV1Api(api_client)
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait
        self._watch: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None
        self.relists = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="endpointslice-watch", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        watch = self._watch
        if watch is not None:
            watch.stop()
            # a watch blocked reading an idle stream sees the stop only with its next event: close the stream
            # (``Watch`` keeps the open response as ``_resp`` while it streams)
            response = getattr(watch, "_resp", None)
            if response is not None:
                try:
                    response.close()
                except Exception:
                    pass
        if self._thread is not None:
            self._thread.join(timeout_s)

    def run(self) -> None:
        failures = 0
        version: str | None = None
        while not self._stopping.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._follow(version)
                failures = 0
            except ApiException as exc:
                if exc.status == 410:  # too old to resume: list afresh
                    version = None
                    continue
                if self._stopping.is_set():
                    return
                failures += 1
                log.warning("EndpointSlice watch failed (HTTP %s); keeping the routing as it is", exc.status)
            except Exception as exc:
                if self._stopping.is_set():
                    return
                failures += 1
                version = None
                log.warning("EndpointSlice watch failed (%s); keeping the routing as it is", type(exc).__name__)
            if failures:
                self._sleep(BACKOFF_S[min(failures, len(BACKOFF_S)) - 1])

    def _list(self) -> str:
        # without preloading the client returns urllib3's response, not the model its stub names
        response: Any = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=MANAGED_SELECTOR, _preload_content=False
        )
        try:
            body = json.loads(response.data)
        finally:
            response.release_conn()
        self.routes.replace(body.get("items") or [])
        self.relists += 1
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _follow(self, version: str) -> str:
        """One watch from ``version``; the version to resume from when the server ends it."""
        self._watch = k8s_watch.Watch(return_type="object")
        for event in self._watch.stream(
            self.discovery.list_namespaced_endpoint_slice,
            self.namespace,
            label_selector=MANAGED_SELECTOR,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
        ):
            if self._stopping.is_set():
                break
            kind, obj = event.get("type"), event.get("raw_object") or {}
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self.routes.event(kind, obj)
            version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        return version
