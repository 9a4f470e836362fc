"""How many gateways send to each served entity's replicas, and how much of a replica's admission each takes.

The policy's per-replica admission limit (``ceil(target x admission_headroom)``) is enforced by every gateway on
its own: with two gateways behind a load balancer a replica may hold twice the limit, and the target the leader
learns (from both gateways' load) is learned at that concurrency. When a gateway goes (killed, cut off), the load
balancer sends all its traffic to the others, but each of them would still let a replica hold only the limit:
the replicas would serve the same load at half the concurrency they had, and fall behind (their micro-batches
shrink with it). So each gateway scales the limit by ``gateways recently / gateways now`` for the entity: the
survivors take the leaver's share at once, and the replicas keep the concurrency they ran at. "Recently" is the
most gateways seen at once over the last ``REMEMBER_S``: a gateway that went for good stops counting after that.

Who is there comes from the state store's load board (``serving.state.scaling.LoadBoard``): every gateway writes
its readings there once a second (the leader a heartbeat), and a gateway whose newest reading is older than
``MEMBER_FRESH_S`` is gone. Pure: the times are passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping

from serving.state.scaling import EntityKey, Reading

MEMBER_FRESH_S = 2.5  # a gateway whose last reading is older than this has gone (readings come once a second)
REMEMBER_S = 600.0  # how long a gateway that went still counts as one that shares the replicas


def members(readings: Iterable[Reading], since: float) -> dict[EntityKey, int]:
    """Per entity, how many other gateways wrote a reading after ``since``."""
    seen: dict[EntityKey, set[str]] = {}
    for r in readings:
        if r.at > since:
            seen.setdefault(r.key, set()).add(r.gateway)
    return {key: len(gateways) for key, gateways in seen.items()}


class Shares:
    """Each entity's count of gateways over time (this one included), and the factor its limit is scaled by."""

    def __init__(self, remember_s: float = REMEMBER_S) -> None:
        self.remember_s = remember_s
        self._counts: dict[EntityKey, deque[tuple[float, int]]] = {}

    def observe(self, now: float, keys: Iterable[EntityKey], others: Mapping[EntityKey, int]) -> None:
        """The gateways sending to each of ``keys`` now: this one and ``others[key]``."""
        for key in keys:
            counts = self._counts.setdefault(key, deque())
            counts.append((now, 1 + others.get(key, 0)))
            while counts and counts[0][0] < now - self.remember_s:
                counts.popleft()
        for key in set(self._counts) - set(keys):
            del self._counts[key]

    def factor(self, key: EntityKey) -> float:
        """Most gateways at once recently over the gateways now: 1 while none has gone."""
        counts = self._counts.get(key)
        if not counts:
            return 1.0
        return max(n for _, n in counts) / counts[-1][1]

    def limit(self, key: EntityKey, policy_limit: int) -> int:
        """The per-replica admission this gateway enforces for the policy's ``policy_limit``."""
        return max(1, math.ceil(policy_limit * self.factor(key) - 1e-9))
