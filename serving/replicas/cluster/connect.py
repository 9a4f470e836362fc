"""One gateway's view of the cluster, from its environment.

``TOLLFREE_BACKEND=kubernetes`` selects it; ``TOLLFREE_K8S_NAMESPACE`` (default: the pod's own namespace,
from its service-account mount), ``TOLLFREE_K8S_TEMPLATE`` (default ``infra/k8s/replica/template.yaml``),
``TOLLFREE_K8S_IMAGE`` (default: the template's image) and ``TOLLFREE_REPLICA_TOKEN`` (required: the
gateways and the pods share it through the Secret ``tollfree-replica-token``). Credentials: the pod's
service account (``load_incluster_config``), else the kubeconfig (``load_kube_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.protocol.wire import REPLICA_TOKEN_ENV
from serving.settings import PROJECT_DIR

if TYPE_CHECKING:  # the Kubernetes client is imported only by a gateway that uses it (half a second)
    from serving.replicas.cluster.api import DeploymentApi
    from serving.replicas.cluster.routes import Routes, SliceWatch

BACKENDS = ("local", "kubernetes")
DEFAULT_TEMPLATE = PROJECT_DIR / "infra" / "k8s" / "replica" / "template.yaml"
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ClusterSettingsError(ValueError):
    """A setting of the Kubernetes backend is missing or wrong; the message names it."""


@dataclass
class Cluster:
    """The Deployments the leader declares and the routing every gateway reads."""

    deployments: DeploymentApi
    routes: Routes
    watch: SliceWatch

    def start(self) -> None:
        self.watch.start()

    def stop(self) -> None:
        self.watch.stop()


def backend_name(environ: Mapping[str, str]) -> str:
    name = environ.get("TOLLFREE_BACKEND", "local") or "local"
    if name not in BACKENDS:
        raise ClusterSettingsError(f"TOLLFREE_BACKEND must be one of {', '.join(BACKENDS)} (got {name[:20]!r})")
    return name


def cluster_from_environ(environ: Mapping[str, str]) -> Cluster | None:
    """The cluster if ``TOLLFREE_BACKEND=kubernetes``, else None (local replica processes)."""
    return from_environ(environ) if backend_name(environ) == "kubernetes" else None


def from_environ(
    environ: Mapping[str, str], api_client: Any = None, namespace_file: Path = POD_NAMESPACE_FILE
) -> Cluster:
    """The cluster for ``TOLLFREE_BACKEND=kubernetes``; ``api_client`` (a ``kubernetes.client.ApiClient``) None
    loads the credentials."""
    from serving.replicas.cluster.api import DeploymentApi
    from serving.replicas.cluster.objects import ReplicaTemplate, TemplateError
    from serving.replicas.cluster.routes import Routes, SliceWatch

    if not environ.get(REPLICA_TOKEN_ENV):
        raise ClusterSettingsError(
            f"TOLLFREE_BACKEND=kubernetes needs {REPLICA_TOKEN_ENV} (the gateways and the "
            "replica pods share it: the Secret tollfree-replica-token)"
        )
    namespace = environ.get("TOLLFREE_K8S_NAMESPACE")
    if not namespace:
        try:
            namespace = namespace_file.read_text().strip()
        except OSError:
            raise ClusterSettingsError(
                "TOLLFREE_K8S_NAMESPACE is not set and this is not a pod (no "
                f"{namespace_file}): set the namespace of the replica Deployments"
            ) from None
    try:
        template = ReplicaTemplate.load(
            Path(environ.get("TOLLFREE_K8S_TEMPLATE") or DEFAULT_TEMPLATE), environ.get("TOLLFREE_K8S_IMAGE") or None
        )
    except TemplateError as exc:
        raise ClusterSettingsError(str(exc)) from exc
    if api_client is None:
        api_client = _credentials()
    routes = Routes(namespace)
    return Cluster(DeploymentApi(namespace, template, api_client), routes, SliceWatch(namespace, routes, api_client))


def _credentials() -> Any:
    from kubernetes import client as k8s
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as exc:
            raise ClusterSettingsError(
                f"no Kubernetes credentials: not in a pod, and no usable kubeconfig ({type(exc).__name__})"
            ) from None
    return k8s.ApiClient()
