"""A lease in the state store: one holder at a time, for ``ttl_s`` after its last renewal.

``hold(holder)`` acquires the lease if it is free, expired, or held by a holder that ``is_gone`` says is
dead (a gateway on this machine whose process is gone: no need to wait out its lease), renews it if
``holder`` has it, and returns the term (it grows at each change of holder); None if another holds it.
Each call is one conditional write, so two gateways racing for it get one winner. The clock is injected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy import and_, case, insert, or_, select, update
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
