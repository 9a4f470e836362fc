"""The replica table in the state store: which replica processes serve which entity, and where.

The gateway that runs a served entity writes its rows whenever the entity's replicas change (one
transaction replaces them); a follower routes to the replicas it lists, and a gateway started on the same
state reads it to adopt the replicas a crashed predecessor left running. Its writers log a failed write,
never raise it: serving does not depend on it (``serving.replicas.book``). Its writes are the leader's, fenced
(``serving.state.lease.Fence``): a gateway whose lease another has taken changes no row, except that it may
withdraw its own (the replicas it hands over once it follows: no other gateway writes rows under its pid).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from sqlalchemy import and_, delete, insert, or_, select, tuple_

from serving.state.changes import notify
from serving.state.database import Database
from serving.state.lease import Fence
from serving.state.schema import replicas

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaRow:
    replica_id: str  # the replica's id, as the gateway that runs it knows it (``serving.traffic.replica``)
    host: str
    port: int
    pid: int
    endpoint: str
    entity: str
    model_uri: str
    backend: str
    started_at: float
    owner_pid: int  # the gateway that runs it

    @property
    def key(self) -> tuple[str, str, str]:
        """The served entity the replica belongs to: (endpoint, entity, model URI)."""
        return self.endpoint, self.entity, self.model_uri


class ReplicaTable:
    """The ``replicas`` table: read it whole, replace one gateway's rows of an entity, forget rows."""

    def __init__(self, database: Database, fence: Fence | None = None) -> None:
        self.database = database
        self.fence = fence

    def all(self) -> list[ReplicaRow]:
        with self.database.engine.connect() as db:
            return [ReplicaRow(**row._mapping) for row in db.execute(select(replicas))]

    def replace(self, endpoint: str, entity: str, model_uri: str, owner_pid: int, rows: Iterable[ReplicaRow]) -> None:
        """The entity's replicas run by gateway ``owner_pid`` are now exactly ``rows`` (a row for one of their
        addresses, left by a gateway that is gone, is replaced)."""
        rows = list(rows)
        with self.database.engine.begin() as db:
            if self.fence is not None and (rows or owner_pid != os.getpid()):
                self.fence.check(db)
            db.execute(
                delete(replicas).where(
                    and_(
                        replicas.c.endpoint == endpoint,
                        replicas.c.entity == entity,
                        replicas.c.model_uri == model_uri,
                        replicas.c.owner_pid == owner_pid,
                    )
                )
            )
            if rows:
                db.execute(
                    delete(replicas).where(
                        tuple_(replicas.c.host, replicas.c.port).in_([(r.host, r.port) for r in rows])
                    )
                )
                db.execute(insert(replicas), [asdict(r) for r in rows])
            notify(db)

    def forget(self, rows: Iterable[ReplicaRow]) -> None:
        addresses = [and_(replicas.c.host == r.host, replicas.c.port == r.port) for r in rows]
        if addresses:
            with self.database.engine.begin() as db:
                if self.fence is not None:
                    self.fence.check(db)
                db.execute(delete(replicas).where(or_(*addresses)))
                notify(db)
