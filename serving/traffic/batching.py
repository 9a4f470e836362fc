"""Whether, and how much, a model gains from predicting concurrent requests as one frame. Pure.

A replica measures its model at batch sizes 1..N when it loads (``ModelRuntime.profile``); this module
turns those timings into a plan the gateway follows: micro-batching on only where a batch is clearly
cheaper per row, the batch size where the per-row cost stops falling, and a short gathering wait.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

PROFILE_SIZES = (1, 2, 4, 8, 16, 32, 64)
MIN_GAIN = 2.0  # batching is on when a row in a full batch costs at most half a single-row call
FLAT_WITHIN = 1.15  # the batch size where per-row cost is within 15 % of its best
MAX_WAIT_CAP_MS = 1.0


@dataclass(frozen=True)
class BatchPlan:
    enabled: bool
    max_batch: int  # rows per predict call (1 when off)
    max_wait_ms: float  # how long a batch may wait for more requests when the replica is busy
    single_ms: float  # measured time of a one-row predict
    gain: float  # per-row cost at batch 1 / per-row cost at max_batch

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BatchPlan:
        plan = cls(
            bool(data["enabled"]),
            int(data["max_batch"]),
            float(data["max_wait_ms"]),
            float(data["single_ms"]),
            float(data["gain"]),
        )
        if plan.max_batch < 1 or plan.max_wait_ms < 0:
            raise ValueError("a batch plan needs max_batch >= 1 and max_wait_ms >= 0")
        return plan


OFF = BatchPlan(enabled=False, max_batch=1, max_wait_ms=0.0, single_ms=0.0, gain=1.0)


def plan_from_profile(ms_per_call: Mapping[int, float]) -> BatchPlan:
    """The plan for a model whose predict took ``ms_per_call[size]`` milliseconds at each batch size.

    The gathering wait is a quarter of a single-row call, capped at 1 ms: a request waits at most that
    long for company, and only while the replica is busy anyway (the gateway never holds a lone request).
    """
    sizes = sorted(s for s, ms in ms_per_call.items() if s >= 1 and ms > 0)
    if not sizes or sizes[0] != 1:
        raise ValueError("a profile needs a timing for batch size 1")
    single = ms_per_call[1]
    per_row = {s: ms_per_call[s] / s for s in sizes}
    best = min(per_row.values())
    knee = next(s for s in sizes if per_row[s] <= best * FLAT_WITHIN)
    gain = single / per_row[knee]
    if len(sizes) == 1 or gain < MIN_GAIN:
        return BatchPlan(False, 1, 0.0, single, round(gain, 3))
    return BatchPlan(True, knee, round(min(MAX_WAIT_CAP_MS, single / 4), 3), single, round(gain, 3))
