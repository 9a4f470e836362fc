"""The ablation of the policy's rules: each rule turned off, one at a time, in the benchmark's process.

Every rule of the policy (``serving/autoscaler/policy.py``, ``load.py``, ``vertical.py``) is a named
constant or a small helper; turning it off sets the constant to its neutral value or replaces the helper
with the plain behaviour it refines (listed per rule below). Only the benchmark's worker processes are
patched, for one run at a time. Rules the ablation showed to earn nothing were removed from the policy;
docs/benchmarks/autoscaler.md lists them with their rows.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from serving.autoscaler import policy as P
from serving.autoscaler import vertical as V


def _proportional_cut(target, p99, goal, util):
    return target * goal / p99


_horizontal = P._horizontal


def _up_at_boundaries(config, signals, state, now, due):
    """The horizontal model decided only at decision_interval_s boundaries (a scale-from-zero still at once)."""
    if due or state.replicas == 0:
        return _horizontal(config, signals, state, now, due)
    return state.replicas, "hold", {}


# rule -> (what turning it off means, {(module, attribute): neutral value})
ABLATIONS: dict[str, tuple[str, dict[tuple[ModuleType, str], Any]]] = {
    "forecast": (
        "sized for the scale-up window's peak alone, no forecast at the lead time",
        {(P, "forecast"): lambda samples, service, lead_s: None},
    ),
    "up-at-boundaries": (
        "a scale-up decided only at decision_interval_s boundaries, as a scale-down",
        {(P, "_horizontal"): _up_at_boundaries},
    ),
    "standing-queue": (
        "a queue that stands adds nothing: arrivals alone size the replicas",
        {(P, "_standing_queue"): lambda config, signals, service_s: 0.0},
    ),
    "settled-stress": (
        "latency stress judged on every second, not on the settled ones",
        {(V, "_stress_samples"): lambda active, window: active},
    ),
    "contention": (
        "latency stress lowers the target without contention too",
        {(V, "_contention"): lambda config, queued_share, util: True},
    ),
    "ceiling": (
        "no ceiling after stress: it lifts without bound at the first calm cycle",
        {(V, "CEILING_LIFT"): math.inf},
    ),
    "util-slack": (
        "the utilisation aim stays at target_utilisation (no rise with latency slack)",
        {(V, "_utilisation_aim"): lambda config, p99, queued_share, slots: config.target_utilisation},
    ),
    "latency-cut": (
        "the latency cut is proportional (target x goal / p99), no queueing formula",
        {(V, "_latency_cut"): _proportional_cut},
    ),
    "hysteresis": (
        "each metric's low mark equals its high mark",
        {(V, "LATENCY_LOW"): V.LATENCY_HIGH, (V, "QUEUE_LOW"): V.QUEUE_HIGH, (V, "UTIL_LOW"): V.UTIL_HIGH},
    ),
    "min-change": ("vertical changes of any size are made (MIN_CHANGE = 0)", {(V, "MIN_CHANGE"): 0.0}),
}


@contextlib.contextmanager
def ablated(rule: str | None) -> Iterator[None]:
    """The policy modules with ``rule`` turned off (None: as shipped), restored afterwards."""
    if rule is None:
        yield
        return
    if rule not in ABLATIONS:
        raise ValueError(f"unknown rule {rule!r}; choose from {', '.join(ABLATIONS)}")
    patch = ABLATIONS[rule][1]
    saved = {key: getattr(*key) for key in patch}
    try:
        for (module, name), value in patch.items():
            setattr(module, name, value)
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
