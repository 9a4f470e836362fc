"""What a replica process does before its first import of Feast.

Feast wraps its definition classes (``FeatureView``, ``FeatureService``, data sources, entities...) in
typeguard's ``@typechecked``, which re-reads and recompiles each wrapped class's source when Feast is
imported: about 3-4 of the 7-9 CPU-seconds a replica spent on imports (measured on the 2-core machine,
2026-12-02, three alternating runs: 8.8, 6.9, 7.1 -> 4.4, 4.3, 4.3 user-seconds). A replica never builds definitions: it reads
them from the Feast registry, already checked when ``feast apply`` (``flows.materialize``) wrote them. So
it makes ``typechecked`` the no-op typeguard itself makes it under ``python -O``, which is typeguard's
documented way of running without these checks. Every other process (flows, tests, ``feast apply``)
keeps them.
"""

from __future__ import annotations

import sys
from typing import Any


def _unchecked(target: Any = None, **_options: Any) -> Any:
    return (lambda wrapped: wrapped) if target is None else target


def skip_feast_type_checks() -> bool:
    """Turn ``typeguard.typechecked`` into a no-op for the Feast imported after this; False (nothing
    done) when Feast is already imported, since its classes are then instrumented already."""
    if "feast" in sys.modules:
        return False
    import typeguard

    typeguard.typechecked = _unchecked
    return True
