"""The ablation of the policy's rules: each rule turned off, one at a time, in the benchmark's process.

Every rule of the policy (``serving/autoscaler/policy.py``, ``load.py``, ``vertical.py``) is a named
constant or a small helper; turning it off sets the constant to its neutral value or replaces the helper
with the plain behaviour it refines (listed per rule below). Only the benchmark's worker processes are
patched, for one run at a time. The rules removed after the ablation of 2026-12-02 are listed with their
rows in benchmarks/README.md.
"""

from __future__ import annotations

import contextlib
import math
from types import ModuleType
from typing import Any, Iterator

from serving.autoscaler import policy as P
from serving.autoscaler import vertical as V


def _proportional_cut(target, p99, goal, util):
    return target * goal / p99


# rule -> (what turning it off means, {(module, attribute): neutral value})
ABLATIONS: dict[str, tuple[str, dict[tuple[ModuleType, str], Any]]] = {
    "surge": ("no decision between 5-s boundaries (SURGE = inf)", {(P, "SURGE"): math.inf}),
    "surge-projection": ("a rising surge sized for where it is, not where it heads in 5 s",
                         {(P, "_projected"): lambda config, signals, service_s: None}),
    "settled-stress": ("latency stress judged on every second, not on the settled ones",
                       {(V, "_stress_samples"): lambda active, window: active}),
    "contention": ("latency stress lowers the target without contention too",
                   {(V, "_contention"): lambda config, queued_share, util: True}),
    "ceiling": ("no ceiling after stress (increases not slowed)", {(V, "_ceiling_after_stress"): lambda target: None}),
    "util-slack": ("the utilisation aim stays at target_utilisation (no rise with latency slack)",
                   {(V, "_utilisation_aim"): lambda config, p99, queued_share, slots: config.target_utilisation}),
    "latency-cut": ("the latency cut is proportional (target x goal / p99), no queueing formula",
                    {(V, "_latency_cut"): _proportional_cut}),
    "hysteresis": ("each metric's low mark equals its high mark",
                   {(V, "LATENCY_LOW"): V.LATENCY_HIGH, (V, "QUEUE_LOW"): V.QUEUE_HIGH, (V, "UTIL_LOW"): V.UTIL_HIGH}),
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
