"""What no policy can do better than on one trace x profile: the floor of bad requests and the clairvoyant bound
on replica-seconds that the autoscaler benchmark's targets are set against (benchmarks/autoscaler_targets.py)."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import pandas as pd

from benchmarks.autoscaler_runs import WARMUP_S, load_trace
from simulator.engine import TAIL_S, service_times, with_warmup
from simulator.policies import tollfree_config
from simulator.profiles import PRESETS

REACH_SMOOTH_S = 10  # the need is the 10-s mean rate: a burst shorter than a replica start is queued


@lru_cache(maxsize=256)
def reach(trace_name: str, profile_name: str, seed: int, quick: bool) -> dict:
    """What no policy that keeps tollfree's scale-down window can do better than, on one trace x profile.

    ``floor_bad``: the requests whose own service time (a batch of one) is over the SLO -- bad whatever
    the capacity. ``bound_rs``: the replica-seconds of a clairvoyant policy that runs every replica 100 %
    busy at its full (batched) throughput on the trace's 10-s mean rate, and, like tollfree, removes a
    replica only after its need has stayed lower for the whole scale-down window (``scale_down_window_s``).
    ``start_bad``: ``floor_bad`` plus what a policy that asks at once for every second's own rate cannot
    answer in time, since a replica is ready only a warm start later (see :func:`start_excess`). All three
    favour the policy (no headroom, a fluid queue with no variance, every start warm); a policy that
    forecasts a rise can still beat ``start_bad``.
    """
    profile = PRESETS[profile_name]
    window = int(tollfree_config(profile).scale_down_window_s)
    full = with_warmup(load_trace(trace_name, seed, quick), WARMUP_S, seed)
    n_warm = int(np.count_nonzero(full.arrivals < WARMUP_S))
    svc_ms = service_times(full, profile, seed)[n_warm:] * 1000.0
    end = math.ceil(full.arrivals[-1] + TAIL_S)
    counts = pd.Series(np.bincount(full.arrivals.astype(np.int64), minlength=end + 1)[: end + 1], dtype=float)
    rate = counts.rolling(REACH_SMOOTH_S, min_periods=1).sum() / REACH_SMOOTH_S
    need = np.maximum(1.0, np.ceil(rate / profile.replica_rps() - 1e-9))
    held = need.rolling(window + 1, min_periods=1).max()
    floor = int(np.count_nonzero(svc_ms > profile.slo_ms))
    start = math.ceil(profile.warm_start_s + profile.model_load_s)
    asked = np.maximum(1.0, np.ceil(counts / profile.replica_rps() - 1e-9)).rolling(window + 1, min_periods=1).max()
    ready = asked.shift(start).fillna(need.iloc[0])  # each second's own rate, asked at once, ready a start later
    excess = start_excess(counts.to_numpy(), ready.to_numpy() * profile.replica_rps(), profile.slo_ms / 1000.0)
    return {
        "floor_bad": floor,
        "bound_rs": float(held.iloc[int(WARMUP_S) :].sum()),
        "start_bad": floor + int(excess[int(WARMUP_S) :].sum()),
    }


def start_excess(arrivals: np.ndarray, capacity_rps: np.ndarray, slo_s: float) -> np.ndarray:
    """Per second, the requests a fluid queue in front of ``capacity_rps`` cannot answer within the SLO:
    what waits beyond ``capacity x slo_s`` is bad."""
    out = np.zeros(len(arrivals))
    queue = 0.0
    for i, (a, c) in enumerate(zip(arrivals, capacity_rps)):
        queue = max(0.0, queue + a - c)
        room = c * slo_s
        if queue > room:
            out[i] = queue - room
            queue = room
    return out
