"""One gateway's endpoints: the parts that run them, built over one store and one replica launcher.

``endpoints`` (``api``) creates, changes and deletes endpoint records; ``rollouts`` brings a config live on
replica sets and holds what serves each endpoint now (``live``); ``reconciler`` (``reconcile``) restores the
endpoints when the gateway starts and keeps them in line with other gateways on the same store;
``ai_gateways`` holds each endpoint's AI gateway and its external models' secrets. Replicas are local
processes, each listed in the replica table while it serves, or the pods of a Deployment per served entity
on Kubernetes (``placement``). The gateway's planes hold this one object: its routes, its data plane and its
autoscaler read the parts and the attributes below.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from serving.endpoints.ai_gateways import AiGateways
from serving.endpoints.api import EndpointApi
from serving.endpoints.live import LiveEndpoint
from serving.endpoints.placement import Placement
from serving.endpoints.reconcile import Reconciler
from serving.endpoints.resolver import VersionResolver
from serving.endpoints.rollouts import Rollouts
from serving.endpoints.store import EndpointStore
from serving.replicas.book import ReplicaBook
from serving.replicas.local import Launcher
from serving.replicas.local_backend import LocalBackend
from serving.replicas.replica_set import ReplicaSet
from serving.state.lease import Fence
from serving.state.replica_table import ReplicaTable

if TYPE_CHECKING:
    from serving.replicas.cluster.connect import Cluster


class EndpointManager:
    def __init__(
        self,
        store: EndpointStore,
        resolver: VersionResolver,
        replica_env: Mapping[str, str],
        log_dir: Path,
        *,
        home: Path | None = None,
        ready_timeout_s: float = 180.0,
        replica_client=None,  # has start/close/send; default: ReplicaClient
        request_timeout_s: float = 30.0,
        cluster: Cluster | None = None,  # replicas as Kubernetes pods (TOLLFREE_BACKEND=kubernetes)
    ) -> None:
        self.store = store
        self.home = home or log_dir.parent
        self.launcher = Launcher.for_gateway(replica_env, log_dir, token_file=self.home / "replica.token")
        self.fence = Fence()  # armed by ``Leadership`` when several gateways share the store
        self.book = ReplicaBook(ReplicaTable(store.database, self.fence), self.launcher)
        self.backend = LocalBackend(self.launcher)  # its warm pool comes with the autoscaler (gateway.app)
        self.cluster = cluster
        self.placement = Placement(self.backend, self.book, cluster)
        if replica_client is None:
            from serving.replicas.client import ReplicaClient

            replica_client = ReplicaClient(self.launcher.token)
        self.replica_client = replica_client
        self.request_timeout_s = request_timeout_s
        self.ai_gateways = AiGateways(store, self.home / "secrets")
        self.secrets = self.ai_gateways.secrets
        self.rollouts = Rollouts(
            store,
            self.placement,
            self.book,
            self._attach,
            ready_timeout_s=ready_timeout_s,
            request_timeout_s=request_timeout_s,
            fence=self.fence,
        )
        self.live: dict[str, LiveEndpoint] = self.rollouts.live  # what serves each endpoint now
        self.endpoints = EndpointApi(store, resolver, self.rollouts, self.ai_gateways)
        self.reconciler = Reconciler(
            store, self.rollouts, self.book, self.placement, self.ai_gateways, self._attach, cluster
        )

    @property
    def leading(self) -> bool:
        """This gateway runs the rollouts, the replicas and the autoscaler (the only one, or the leader)."""
        return self.rollouts.leading

    @leading.setter
    def leading(self, leading: bool) -> None:
        self.rollouts.leading = leading

    async def served(self, name: str) -> LiveEndpoint:
        """The live endpoint ``name`` for a request (``Rollouts.served``: one being restored is waited for)."""
        return await self.rollouts.served(name)

    def replica_set(self, endpoint: str, served_entity: str) -> ReplicaSet | None:
        """The replica set of ``endpoint``'s served entity ``served_entity`` (None once it has left the routing)."""
        live = self.live.get(endpoint)
        return live.replica_sets.get(served_entity) if live is not None else None

    async def open(self) -> None:
        await self.replica_client.start()

    async def shutdown(self, *, keep_replicas: bool = False) -> None:
        """Stop: rollouts cancelled, then every replica stopped, unless ``keep_replicas`` (one of several
        gateways: the next leader adopts them)."""
        # a cluster's sets stop routing either way; its Deployments stay
        await self.rollouts.stop(stop_replicas=not keep_replicas or self.cluster is not None)
        await self.book.flush()  # the replica table is up to date
        await self.backend.close()
        await run_in_threadpool(self.launcher.close)  # the fork server; the replicas it forked are handled above
        await self.replica_client.close()

    def _attach(self, replica_set: ReplicaSet) -> None:
        """Send ``replica_set``'s batches through the replica client."""
        replica_set.attach(self.replica_client.send, self.request_timeout_s)
