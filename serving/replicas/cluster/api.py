"""The leader's calls to the Kubernetes API, through the official client: create, scale and delete each served
entity's Deployment (with its Service and PodDisruptionBudget), and list the ones it manages.

Least privilege (``infra/k8s/gateway-rbac.yaml``), in the namespace only: Deployments ``create``, ``get``,
``list``, ``delete``; ``deployments/scale`` ``get``, ``patch``; Services and PodDisruptionBudgets ``create``;
EndpointSlices ``list``, ``watch`` (``routes``). No pods, no Secrets: the replica token reaches the pods
through the template's ``secretRef``, and the Service and budget go with their Deployment (owner references).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from serving.replicas.cluster.objects import MANAGED_SELECTOR, ReplicaTemplate, Wanted, owned_by

log = logging.getLogger(__name__)

_MERGE_PATCH = "application/merge-patch+json"

T = TypeVar("T")


class ClusterError(RuntimeError):
    """The API server refused or did not answer; the message names the call and the status, never a body."""


def _failed(what: str, exc: ApiException) -> ClusterError:
    return ClusterError(f"Kubernetes API: {what} failed with HTTP {exc.status} {exc.reason or ''}".rstrip())


def _body(model: T | None, kind: str) -> T:
    """A rendered object as the client's model (``from_dict`` gives None only for no object)."""
    if model is None:
        raise ClusterError(f"the replica template rendered no {kind}")
    return model


def _uid(deployment: k8s.V1Deployment, name: str) -> str:
    """The Deployment's uid, which its Service and budget name as their owner."""
    if deployment.metadata is None or not deployment.metadata.uid:
        raise ClusterError(f"Kubernetes API: Deployment {name} came back without a uid")
    return str(deployment.metadata.uid)


class DeploymentApi:
    """One namespace's replica Deployments, through the API server (``kubernetes.config`` loads the credentials
    before, see ``connect``)."""

    def __init__(
        self,
        namespace: str,
        template: ReplicaTemplate,
        api_client: k8s.ApiClient | None = None,
        request_timeout_s: float = 10.0,
    ) -> None:
        if not namespace:
            raise ValueError("namespace must not be empty")
        self.namespace = namespace
        self.template = template
        self.apps = k8s.AppsV1Api(api_client)
        self.core = k8s.CoreV1Api(api_client)
        self.policy = k8s.PolicyV1Api(api_client)
        self.timeout = request_timeout_s

    def apply(self, wanted: Wanted, replicas: int) -> int:
        """The entity's Deployment with at least ``replicas`` pods, its Service and budget: created, or the
        existing ones kept (a gateway restart, a new leader) and scaled up to ``replicas`` if they have fewer.
        Returns the count the Deployment now asks for."""
        objects = self.template.render(wanted, replicas)
        name = wanted.name
        try:
            created = self.apps.create_namespaced_deployment(
                self.namespace,
                _body(k8s.V1Deployment.from_dict(objects["Deployment"]), "Deployment"),
                _request_timeout=self.timeout,
            )
            uid, declared = _uid(created, name), replicas
            log.info("created Deployment %s for %s with %d replica(s)", name, wanted.model_uri, replicas)
        except ApiException as exc:
            if exc.status != 409:
                raise _failed(f"create Deployment {name}", exc) from exc
            existing = self._read(name)
            uid, declared = _uid(existing, name), int(existing.spec.replicas or 0)
            log.info("Deployment %s exists with %d replica(s): adopted", name, declared)
            if declared < replicas:
                self.scale(name, replicas)
                declared = replicas
        self._create_owned(objects, name, uid)
        return declared

    def scale(self, name: str, replicas: int) -> None:
        """Set the Deployment's count through the scale subresource, only when it differs (as Knative's scaler does)."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        try:
            scale = self.apps.read_namespaced_deployment_scale(name, self.namespace, _request_timeout=self.timeout)
            if scale.spec is not None and scale.spec.replicas == replicas:
                return
            self.apps.patch_namespaced_deployment_scale(
                name,
                self.namespace,
                {"spec": {"replicas": replicas}},
                _content_type=_MERGE_PATCH,
                _request_timeout=self.timeout,
            )
        except ApiException as exc:
            raise _failed(f"scale Deployment {name} to {replicas}", exc) from exc

    def delete(self, name: str) -> None:
        """The Deployment, and with it (garbage collection) its pods, Service and budget; gone already is fine."""
        try:
            self.apps.delete_namespaced_deployment(
                name, self.namespace, propagation_policy="Background", _request_timeout=self.timeout
            )
            log.info("deleted Deployment %s", name)
        except ApiException as exc:
            if exc.status != 404:
                raise _failed(f"delete Deployment {name}", exc) from exc

    def managed(self) -> list[str]:
        """The names of the Deployments the gateways created in the namespace."""
        try:
            found = self.apps.list_namespaced_deployment(
                self.namespace, label_selector=MANAGED_SELECTOR, _request_timeout=self.timeout
            )
        except ApiException as exc:
            raise _failed("list Deployments", exc) from exc
        return [d.metadata.name for d in found.items if d.metadata is not None and d.metadata.name]

    def _read(self, name: str) -> Any:
        try:
            return self.apps.read_namespaced_deployment(name, self.namespace, _request_timeout=self.timeout)
        except ApiException as exc:
            raise _failed(f"read Deployment {name}", exc) from exc

    def _create_owned(self, objects: dict[str, dict[str, Any]], name: str, uid: str) -> None:
        creates: list[tuple[str, Callable[..., Any], Any]] = [
            ("Service", self.core.create_namespaced_service, k8s.V1Service)
        ]
        if "PodDisruptionBudget" in objects:
            creates.append(
                ("PodDisruptionBudget", self.policy.create_namespaced_pod_disruption_budget, k8s.V1PodDisruptionBudget)
            )
        for kind, create, model in creates:
            try:
                body = _body(model.from_dict(owned_by(objects[kind], name, uid)), kind)
                create(self.namespace, body, _request_timeout=self.timeout)
            except ApiException as exc:
                if exc.status != 409:  # there already: it came with the Deployment before
                    raise _failed(f"create {kind} {name}", exc) from exc
