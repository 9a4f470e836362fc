"""A replica another gateway runs (the leader, when several gateways share a store): an address to route to.

A follower sends it batches like any replica (with the shared replica token) and counts what it has out; it
neither starts nor stops it, and takes it as alive while the state store's replica table lists it. Its id is
the one the leader gave the process, read from that table.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class RemoteReplica:
    """A replica process another gateway runs (a ``serving.traffic.replica.Replica``)."""

    id: str  # the running gateway's id for it (``serving.traffic.replica.process_id``)
    host: str
    port: int
    outstanding: int = field(default=0)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> None:
        """Its process is the other gateway's, perhaps on another machine: none to read here."""
        return None

    def alive(self) -> bool:
        return True
