"""The ablation of the policy's rules: each rule turned off, one at a time, in the benchmark's process.

Every rule of ``serving/autoscaler/policy.py`` is a named constant or a small helper; turning it off sets
the constant to its neutral value or replaces the helper with the plain behaviour it refines (listed per
rule below). Only the benchmark's worker processes are patched, for one run at a time.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

from serving.autoscaler import policy as P


def _plain_loads(samples, service_s):
    return [P._load(s, service_s) for s in samples]


def _proportional_cut(target, p99, goal, util):
    return target * goal / p99


# rule -> (what turning it off means, {policy attribute: neutral value})
ABLATIONS: dict[str, tuple[str, dict[str, Any]]] = {
    "surge": ("no decision between 5-s boundaries (SURGE = inf)", {"SURGE": math.inf}),
    "surge-continue": ("a scale-up under way needs a new 1.5x surge to act between boundaries",
                       {"_surge_over": lambda config, state: P.SURGE}),
    "surge-service": ("a surge sized with the interval's service time, not the last second's if longer",
                      {"_surge_service_s": lambda signals, now, base: base}),
    "surge-projection": ("a rising surge sized for where it is, not where it heads in 5 s",
                         {"_rising": lambda signals, now, service_s: None}),
    "little-window": ("a slow model's arrivals term is this second's rate x service time, not the arrivals "
                      "of the last service time", {"_loads": _plain_loads}),
    "drain": ("no backlog term in the load (DRAIN_S = inf)", {"DRAIN_S": math.inf}),
    "growth-cap": ("no cap on what one cycle adds", {"_growth_cap": lambda config, current, load_now, target: math.inf}),
    "idle-hold": ("the vertical acts on a window that ends idle", {"_idle_now": lambda window: False}),
    "settled-stress": ("latency stress judged on every second, not on the settled ones",
                       {"_stress_samples": lambda active, window: active}),
    "contention": ("latency stress lowers the target without contention too",
                   {"_contention": lambda config, queued_share, util: True}),
    "ceiling": ("no ceiling after stress (increases not slowed)", {"_ceiling_after_stress": lambda target: None}),
    "headroom": ("no target / mean in-flight ratio in the utilisation aim (HEADROOM_MAX = 1)",
                 {"HEADROOM_MAX": 1.0}),
    "util-slack": ("the utilisation aim stays at target_utilisation (no rise with latency slack)",
                   {"_utilisation_aim": lambda config, p99, queued_share, slots: config.target_utilisation}),
    "latency-cut": ("the latency cut is proportional (target x goal / p99), no queueing formula",
                    {"_latency_cut": _proportional_cut}),
    "hysteresis": ("each metric's low mark equals its high mark",
                   {"LATENCY_LOW": P.LATENCY_HIGH, "QUEUE_LOW": P.QUEUE_HIGH, "UTIL_LOW": P.UTIL_HIGH}),
    "min-change": ("vertical changes of any size are made (MIN_CHANGE = 0)", {"MIN_CHANGE": 0.0}),
}


@contextlib.contextmanager
def ablated(rule: str | None) -> Iterator[None]:
    """The policy module with ``rule`` turned off (None: as shipped), restored afterwards."""
    if rule is None:
        yield
        return
    if rule not in ABLATIONS:
        raise ValueError(f"unknown rule {rule!r}; choose from {', '.join(ABLATIONS)}")
    patch = ABLATIONS[rule][1]
    saved: dict[str, Callable | float] = {name: getattr(P, name) for name in patch}
    try:
        for name, value in patch.items():
            setattr(P, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(P, name, value)
