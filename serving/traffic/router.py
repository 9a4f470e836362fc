"""Request routing decisions, pure: which served entity (by traffic split), which replica.

Randomness is injected (a ``random.Random``), so tests seed it and get the same choices.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from serving.traffic.replica import Replica

R = TypeVar("R", bound=Replica)


def choose_entity(weights: Sequence[tuple[str, int]], rng: random.Random) -> str:
    """A served entity drawn with probability proportional to its traffic percentage."""
    live = [(name, pct) for name, pct in weights if pct > 0]
    if not live:
        raise ValueError("no served entity has traffic")
    point = rng.uniform(0, sum(pct for _, pct in live))
    for name, pct in live:
        point -= pct
        if point < 0:
            return name
    return live[-1][0]


def pick_replica(replicas: Sequence[R], limit: int | None) -> R | None:
    """The replica with the fewest outstanding requests, among those under ``limit``; None if all full.

    Ties go to the earliest replica in the list, which keeps a warm replica busy before a new one.
    """
    best: R | None = None
    for replica in replicas:
        if limit is not None and replica.outstanding >= limit:
            continue
        if best is None or replica.outstanding < best.outstanding:
            best = replica
    return best
