"""A replica another gateway runs (the leader, when several gateways share a store): an address to route to.

A follower sends it batches like any replica (with the shared replica token) and counts what it has out; it
neither starts nor stops it, and takes it as alive while the replica registry lists it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(eq=False)
class RemoteReplica:
    host: str
    port: int
    pid: int  # on the leader's machine
    outstanding: int = field(default=0)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def alive(self) -> bool:
        return True
