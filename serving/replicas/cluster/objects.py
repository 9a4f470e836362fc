"""The Kubernetes objects of one served entity, rendered from the replica template (pure: no API calls).

Each served entity (endpoint, entity, model version) gets a Deployment, a headless Service and a
PodDisruptionBudget, all named ``tollfree-<endpoint>-<entity>-<hash>``: a DNS-1123 label of at most 63
characters, the hash (of endpoint, entity and model URI) keeping two versions of one entity apart during a
rollout. Every object carries the label ``tollfree.io/replica-set: <name>`` (the Service's copy reaches its
EndpointSlices, which is how the gateways find the pods) and ``app.kubernetes.io/managed-by:
tollfree-gateway`` (what the leader lists to find Deployments nobody needs any more).
"""

from __future__ import annotations

import copy
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPLICA_SET_LABEL = "tollfree.io/replica-set"
MANAGED_BY = ("app.kubernetes.io/managed-by", "tollfree-gateway")
MANAGED_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"
CONTAINER = "replica"  # the template's container that serves the model

# Databricks' workload sizes are concurrency bands (Small 4, Medium 8-16, Large 16-64 requests at once);
# here each is what one replica pod requests of a node. Limits bound memory only (CPU throttling would
# distort the busy clock the autoscaler reads).
RESOURCES: dict[str, dict[str, dict[str, str]]] = {
    "Small": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    "Medium": {"requests": {"cpu": "2", "memory": "2Gi"}, "limits": {"memory": "4Gi"}},
    "Large": {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
}

_NOT_DNS = re.compile(r"[^a-z0-9-]+")


class TemplateError(ValueError):
    """The replica template lacks what the backend fills in."""


def object_name(endpoint: str, entity: str, model_uri: str) -> str:
    """``tollfree-<endpoint>-<entity>-<8 hex>``, cut to a 63-character DNS-1123 label."""
    digest = hashlib.sha256(f"{endpoint}\0{entity}\0{model_uri}".encode()).hexdigest()[:8]
    readable = _NOT_DNS.sub("-", f"{endpoint}-{entity}".lower()).strip("-")
    return f"tollfree-{readable[: 63 - len('tollfree-') - 9].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class Wanted:
    """What one served entity needs from the cluster."""

    endpoint: str
    entity: str
    model_uri: str
    workload_size: str = "Small"

    @property
    def name(self) -> str:
        return object_name(self.endpoint, self.entity, self.model_uri)


@dataclass(frozen=True)
class ReplicaTemplate:
    """The Deployment, Service and PodDisruptionBudget of ``infra/k8s/replica/template.yaml`` (or the file
    ``TOLLFREE_K8S_TEMPLATE`` names), as plain dicts."""

    deployment: dict[str, Any]
    service: dict[str, Any]
    budget: dict[str, Any] | None
    image: str | None = None  # replaces the container's image when set (TOLLFREE_K8S_IMAGE)

    @classmethod
    def load(cls, path: Path, image: str | None = None) -> ReplicaTemplate:
        try:
            docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        except (OSError, yaml.YAMLError) as exc:
            raise TemplateError(f"replica template {path} is unreadable: {type(exc).__name__}") from exc
        kinds: dict[str, dict[str, Any]] = {}
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") not in ("Deployment", "Service", "PodDisruptionBudget"):
                raise TemplateError(
                    f"replica template {path} may hold only a Deployment, a Service and a PodDisruptionBudget"
                )
            kinds[doc["kind"]] = doc
        if "Deployment" not in kinds or "Service" not in kinds:
            raise TemplateError(f"replica template {path} needs a Deployment and a Service")
        template = cls(kinds["Deployment"], kinds["Service"], kinds.get("PodDisruptionBudget"), image)
        template.render(Wanted("check", "check", "models:/check/1"), 1)  # fails now, not at the first rollout
        return template

    def render(self, wanted: Wanted, replicas: int) -> dict[str, dict[str, Any]]:
        """The entity's objects by kind; the Service and the budget still need their owner (``owned_by``)."""
        name = wanted.name
        labels = {REPLICA_SET_LABEL: name, MANAGED_BY[0]: MANAGED_BY[1]}
        annotations = {
            "tollfree.io/endpoint": wanted.endpoint,
            "tollfree.io/served-entity": wanted.entity,
            "tollfree.io/model-uri": wanted.model_uri,
        }
        selector = {"app.kubernetes.io/name": "tollfree-replica", REPLICA_SET_LABEL: name}

        deployment = _named(self.deployment, name, labels, annotations)
        spec = deployment["spec"]
        spec["replicas"] = replicas
        spec["selector"] = {"matchLabels": dict(selector)}
        pod = spec.setdefault("template", {})
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(selector)
        pod["metadata"].setdefault("annotations", {}).update(annotations)
        container = _container(pod, name)
        container["command"] = _with_model(container.get("command"), wanted.model_uri)
        container["resources"] = copy.deepcopy(RESOURCES.get(wanted.workload_size, RESOURCES["Small"]))
        if self.image:
            container["image"] = self.image

        service = _named(self.service, name, labels, annotations)
        service["spec"]["selector"] = dict(selector)
        service["spec"]["clusterIP"] = "None"
        objects = {"Deployment": deployment, "Service": service}
        if self.budget is not None:
            budget = _named(self.budget, name, labels, annotations)
            budget["spec"]["selector"] = {"matchLabels": dict(selector)}
            objects["PodDisruptionBudget"] = budget
        return objects


def owned_by(obj: dict[str, Any], deployment_name: str, deployment_uid: str) -> dict[str, Any]:
    """``obj`` owned by the entity's Deployment: Kubernetes' garbage collector deletes it with the Deployment."""
    owned = copy.deepcopy(obj)
    owned["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": deployment_name,
            "uid": deployment_uid,
            "controller": True,
            "blockOwnerDeletion": False,
        }
    ]
    return owned


def _named(doc: dict[str, Any], name: str, labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(doc)
    meta = out.setdefault("metadata", {})
    meta["name"] = name
    meta.pop("namespace", None)  # the backend's namespace
    meta.setdefault("labels", {}).update(labels)
    meta.setdefault("annotations", {}).update(annotations)
    out.setdefault("spec", {})
    return out


def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    for container in pod.get("spec", {}).get("containers", []):
        if container.get("name") == CONTAINER:
            return container
    raise TemplateError(f"the replica template's Deployment has no container named {CONTAINER!r} (for {name})")


def _with_model(command: Any, model_uri: str) -> list[str]:
    if not isinstance(command, list) or "--model-uri" not in command[:-1]:
        raise TemplateError(f"the replica template's {CONTAINER!r} container command must pass --model-uri")
    out = [str(part) for part in command]
    out[out.index("--model-uri") + 1] = model_uri
    return out
