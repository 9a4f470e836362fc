"""What the gateway knows of a replica, whatever runs it: the one ``Replica`` type and its id.

Three kinds implement it: a local process this gateway runs (``serving.replicas.local.LocalReplica``), a
process another gateway runs that this one routes to (``serving.replicas.remote.RemoteReplica``) and a pod
on Kubernetes (``serving.replicas.cluster.routes.PodReplica``). The dispatcher and the router send to it,
the replica set keeps it in the routing, the autoscaler reads its load and busy clock, the client reaches it.

A replica is known by its ``id``, a string that names the one replica it is for every gateway:

- ``local:<host>:<port>:<pid>``: a replica process on a machine (``process_id``). A follower routing to a
  process the leader runs gives it the leader's id (it is stored with the replica's row in the state store),
  so both gateways' readings of its busy clock meet under one key.
- ``pod:<namespace>/<pod name>``: a pod (``pod_id``).
"""

from __future__ import annotations

from typing import Protocol


class Replica(Protocol):
    """A replica as the gateway uses it."""

    outstanding: int
    """Requests this gateway has sent it that are not answered yet; the dispatcher keeps it."""

    @property
    def id(self) -> str:
        """The replica's identity, stable while it runs (see the module)."""
        ...

    @property
    def url(self) -> str:
        """Where it listens, ``http://host:port``: the client sends batches there."""
        ...

    @property
    def pid(self) -> int | None:
        """Its process on this machine (the autoscaler reads its CPU until it has answered, the control plane
        shows its memory); None where the process is not on this machine (a pod)."""
        ...

    def alive(self) -> bool:
        """It may be sent requests: a local process that has not exited; a remote process or a pod while the
        state store or the EndpointSlices list it."""
        ...


def process_id(host: str, port: int, pid: int) -> str:
    """The id of the replica process ``pid`` listening on ``host:port``."""
    return f"local:{host}:{port}:{pid}"


def pod_id(namespace: str, name: str) -> str:
    """The id of the replica pod ``name`` in ``namespace``."""
    return f"pod:{namespace}/{name}"
