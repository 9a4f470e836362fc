"""Kubernetes Deployments as an autoscaler backend: the ``scale`` subresource, nothing else.

``set_replicas`` reads ``deployments/scale`` and, only when the count differs (as Knative's scaler
does), sends a JSON merge patch ``{"spec": {"replicas": n}}`` to it through the official client's
``AppsV1Api.patch_namespaced_deployment_scale``. ``ready_replicas`` reads ``status.readyReplicas``
from ``deployments/status``. Readiness probes and surge-before-drain live in the Deployment manifest.

RBAC the service account needs, in the namespace of the Deployments (least privilege):
``apps`` / ``deployments/scale``: ``get``, ``patch``; ``apps`` / ``deployments/status``: ``get``.

Testing: no Kubernetes API server runs on the machines this project is built on; the tests drive
this backend through the real client and its models with the ``ApiClient``'s HTTP layer (the urllib3
pool manager) replaced by a fake that answers like the API server, so request paths, verbs, bodies
and response deserialisation are exercised, but not a real cluster.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from kubernetes import client as k8s

_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


def deployment_name(endpoint: str, entity: str) -> str:
    """The Deployment of a served entity: ``tollfree-<endpoint>-<entity>`` as a DNS-1123 label."""
    raw = f"tollfree-{endpoint}-{entity}".lower().replace("_", "-").replace(".", "-")
    name = _DNS_LABEL.sub("-", raw).strip("-")[:63].rstrip("-")
    return name


class KubernetesBackend:
    """Scale Deployments with the official client (``kubernetes.config`` loads credentials outside)."""

    def __init__(self, namespace: str, api_client: Optional[k8s.ApiClient] = None,
                 name_for: Callable[[str, str], str] = deployment_name,
                 request_timeout_s: float = 10.0) -> None:
        if not namespace:
            raise ValueError("namespace must not be empty")
        self.namespace = namespace
        self.apps = k8s.AppsV1Api(api_client)
        self.name_for = name_for
        self.timeout = request_timeout_s

    def current_replicas(self, endpoint: str, entity: str) -> int:
        """``spec.replicas`` of the scale subresource (what was asked for)."""
        scale = self.apps.read_namespaced_deployment_scale(
            self.name_for(endpoint, entity), self.namespace, _request_timeout=self.timeout)
        return int(scale.spec.replicas or 0) if scale.spec is not None else 0

    def set_replicas(self, endpoint: str, entity: str, n: int) -> None:
        if n < 0:
            raise ValueError(f"replicas must be >= 0, got {n}")
        if self.current_replicas(endpoint, entity) == n:
            return
        self.apps.patch_namespaced_deployment_scale(
            self.name_for(endpoint, entity), self.namespace, {"spec": {"replicas": n}},
            _content_type="application/merge-patch+json", _request_timeout=self.timeout)

    def ready_replicas(self, endpoint: str, entity: str) -> int:
        deployment = self.apps.read_namespaced_deployment_status(
            self.name_for(endpoint, entity), self.namespace, _request_timeout=self.timeout)
        status = deployment.status
        return int(status.ready_replicas or 0) if status is not None else 0
