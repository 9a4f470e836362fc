"""A lease in the state store: one holder at a time, for ``ttl_s`` after its last renewal.

``hold(holder)`` acquires the lease if it is free, expired, or held by a holder that ``is_gone`` says is
dead (a gateway on this machine whose process is gone: no need to wait out its lease), renews it if
``holder`` has it, and returns the term (it grows at each change of holder); None if another holds it.
Each call is one conditional write, so two gateways racing for it get one winner. The clock is injected.

The term is the leader's fencing token (``Fence``): each of its writes checks, in its own transaction, that the
lease still has that holder and term, and locks the lease's row until it commits, so no write of a leader whose
lease another has taken can land after the takeover (one that lost touch with the store while its lease ran out,
say), as ZooKeeper's and etcd's users fence with a lock's revision.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import Connection, and_, case, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from serving.state.database import Database
from serving.state.schema import leases


class Lease:
    def __init__(
        self,
        database: Database,
        name: str = "leader",
        ttl_s: float = 10.0,
        *,
        clock: Callable[[], float] = time.time,
        is_gone: Callable[[str], bool] = lambda holder: False,
    ) -> None:
        self.database = database
        self.name = name
        self.ttl_s = ttl_s
        self._clock = clock
        self._is_gone = is_gone

    def holder(self) -> tuple[str, float, int] | None:
        """(holder, expires_at, term) as stored, expired or not."""
        with self.database.engine.connect() as db:
            row = db.execute(
                select(leases.c.holder, leases.c.expires_at, leases.c.term).where(leases.c.name == self.name)
            ).first()
        return (row[0], row[1], row[2]) if row is not None else None

    def hold(self, holder: str) -> int | None:
        now = self._clock()
        current = self.holder()
        free = or_(leases.c.holder == holder, leases.c.expires_at < now)
        if current is not None and current[0] != holder and current[1] >= now and self._is_gone(current[0]):
            free = or_(free, leases.c.holder == current[0])  # its holder died: take it now, not at expiry
        with self.database.engine.begin() as db:
            row = db.execute(
                update(leases)
                .where(and_(leases.c.name == self.name, free))
                .values(
                    holder=holder,
                    expires_at=now + self.ttl_s,
                    term=case((leases.c.holder == holder, leases.c.term), else_=leases.c.term + 1),
                )
                .returning(leases.c.term)
            ).first()
            if row is not None:
                return int(row[0])
        if current is not None:
            return None
        try:
            with self.database.engine.begin() as db:
                db.execute(insert(leases).values(name=self.name, holder=holder, expires_at=now + self.ttl_s, term=1))
        except IntegrityError:
            return None  # another won the first acquisition
        return 1

    def release(self, holder: str) -> None:
        """Give it up at once (a graceful stop), if ``holder`` still has it."""
        with self.database.engine.begin() as db:
            db.execute(
                update(leases).where(and_(leases.c.name == self.name, leases.c.holder == holder)).values(expires_at=0.0)
            )


class StaleLeader(RuntimeError):
    """A leader write refused: the lease is no longer this gateway's, in the term it led with."""


class Fence:
    """This gateway's fencing token for its leader writes. Unarmed (one gateway on SQLite, no lease), it checks
    nothing; armed (``Leadership`` arms it for gateways sharing PostgreSQL), a write passes only while ``hold``
    has given it the current term, and never between ``drop`` and the next ``hold``."""

    def __init__(self, name: str = "leader") -> None:
        self.name = name
        self.armed = False
        self.holder: str | None = None
        self.term: int | None = None

    def hold(self, holder: str, term: int) -> None:
        self.armed, self.holder, self.term = True, holder, term

    def drop(self) -> None:
        """Not the leader: every fenced write is refused until the next ``hold``."""
        self.armed, self.term = True, None

    def check(self, db: Connection) -> None:
        """Inside a write's transaction: StaleLeader unless the lease is still ``holder``'s in ``term``; the
        lease's row is then locked (shared) until the transaction ends, so a takeover waits for this write."""
        if not self.armed:
            return
        if self.term is None:
            raise StaleLeader("this gateway is not the leader")
        query = select(leases.c.holder, leases.c.term).where(leases.c.name == self.name)
        if db.dialect.name == "postgresql":
            query = query.with_for_update(read=True)
        row = db.execute(query).first()
        if row is None or (row[0], row[1]) != (self.holder, self.term):
            raise StaleLeader(
                f"the leader lease moved on (term {row[1] if row else '-'}, this gateway led in {self.term})"
            )
