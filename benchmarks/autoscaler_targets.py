"""The autoscaler benchmark's trace sets and targets: pure functions over its result rows.

A row is one trace instance (trace, seed) x profile; each policy's run of it is a dict with at least
``bad``, ``replica_seconds`` and ``requests``. The targets (issue 19):

1. Pareto: no baseline dominates tollfree (fewer-or-equal bad requests and fewer-or-equal
   replica-seconds, one of them strictly fewer).
2. Near the limit: tollfree's bad requests at most the trace's floor plus 1 % of its requests, and its
   replica-seconds at most 2x the clairvoyant bound under the same scale-down window (:func:`reach`);
   1.5x on the median row.
3. Kept: spike rows with >= 5x fewer bad requests than HPA, ramp rows at capacity in < 60 s, and the
   vertical axis within 20 % of the best fixed target after 3 cycles and steady.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable, Mapping, Sequence

from serving.autoscaler.simulate.policies import POLICIES, USER_VARIANTS

# every policy runs on every row; tollfree is judged against the others
ALL_POLICIES = POLICIES + USER_VARIANTS
BASELINES = tuple(p for p in ALL_POLICIES if p != "tollfree")

# Tune on these only (seed 0 of the traces every rule so far was judged on) ...
TUNING = tuple((t, 0) for t in ("azure_code", "azure_conv", "spike", "ramp", "diurnal", "onoff"))
# ... and report on these too, generated once, never tuned on: seeds 1-5 of the synthetic traces and of
# three shapes added for it (serving/autoscaler/simulate/traces.py: bursty, sawtooth, flash)
HELD_OUT = tuple((t, s) for t in ("spike", "ramp", "diurnal", "onoff", "bursty", "sawtooth", "flash")
                 for s in range(1, 6))
SETS = {"tuning": TUNING, "held-out": HELD_OUT}

EXTRA_BAD_SHARE = 0.01      # bad requests allowed over the floor, as a share of the trace's requests
RS_RATIO_ROW = 2.0          # replica-seconds allowed, as a multiple of the clairvoyant bound, per row
RS_RATIO_MEDIAN = 1.5       # ... and on the median row
SPIKE_RATIO = 5.0
RAMP_S = 60.0
VERTICAL_BAND = 0.2


def dominates(b: Mapping, t: Mapping) -> bool:
    """``b`` has fewer-or-equal bad requests and replica-seconds than ``t``, one of them strictly fewer."""
    return (b["bad"] <= t["bad"] and b["replica_seconds"] <= t["replica_seconds"]
            and (b["bad"] < t["bad"] or b["replica_seconds"] < t["replica_seconds"]))


def unreachable(b: Mapping, r: Mapping) -> bool:
    """Baseline ``b`` sits at the trace's floor with fewer replica-seconds than the bound ``r`` allows:
    it dominates every policy that keeps tollfree's scale-down window, not only tollfree."""
    return b["bad"] <= r["floor_bad"] and b["replica_seconds"] < r["bound_rs"]


def near_limit(t: Mapping, r: Mapping) -> dict:
    """Target 2 on one row: the distances to the floor and to the bound."""
    extra = (t["bad"] - r["floor_bad"]) / max(1, t["requests"])
    ratio = t["replica_seconds"] / r["bound_rs"] if r["bound_rs"] > 0 else math.inf
    out = {"extra_bad_share": extra, "rs_ratio": ratio, "ok": extra <= EXTRA_BAD_SHARE and ratio <= RS_RATIO_ROW}
    if "start_bad" in r:
        # the same with the floor that counts what replica starts leave unanswered (proposed)
        out["extra_over_start"] = (t["bad"] - r["start_bad"]) / max(1, t["requests"])
        out["ok_start"] = out["extra_over_start"] <= EXTRA_BAD_SHARE and ratio <= RS_RATIO_ROW
    return out


def row_checks(mine: Mapping, baselines: Mapping[str, Mapping], r: Mapping) -> dict:
    """Targets 1 and 2 on one row, with what each needs to be read."""
    dominating = [name for name, b in baselines.items() if dominates(b, mine)]
    return {"dominated_by": dominating, "out_of_reach": [n for n in dominating if unreachable(baselines[n], r)],
            "floor_bad": r["floor_bad"], "bound_rs": r["bound_rs"], **near_limit(mine, r)}


def median_ratio(checks: Iterable[Mapping]) -> float:
    return statistics.median(c["rs_ratio"] for c in checks)


def spike_ratio(mine: Mapping, hpa: Mapping) -> float:
    """HPA's bad requests over tollfree's (tollfree's at least 1)."""
    return hpa["bad"] / max(1, mine["bad"])


def vertical_check(learned: Sequence[tuple[float, float]], best: float, cycles: int = 3) -> dict:
    """The learned target after ``cycles`` vertical cycles within the band of ``best``, and every later one."""
    after = [x for _, x in learned[cycles - 1:]]
    if not after:
        return {"ok": False, "detail": "no cycles"}
    worst = max(abs(x / best - 1) for x in after)
    return {"ok": abs(after[0] / best - 1) <= VERTICAL_BAND and worst <= VERTICAL_BAND,
            "detail": f"best fixed {best:g}, after {cycles} cycles {after[0]:g}, later {min(after):g}..{max(after):g}"}


def advantage(mine: Mapping, b: Mapping) -> float:
    """How far tollfree is ahead of ``b`` on one row: log ratios of replica-seconds and of bad requests
    (each bad count plus 0.1 % of the requests, so a handful of bad requests does not read as infinite)."""
    eps = 0.001 * max(1, mine["requests"])
    return (math.log(b["replica_seconds"] / max(mine["replica_seconds"], 1e-9))
            + math.log((b["bad"] + eps) / (mine["bad"] + eps)))


def extremes(rows: Sequence[Mapping], k: int = 3) -> tuple[list[Mapping], list[Mapping]]:
    """The ``k`` rows where tollfree wins most and the ``k`` where it loses most, by the advantage over its
    nearest baseline on the row (``rows``: each with ``mine`` and ``baselines``)."""
    scored = sorted(rows, key=lambda r: min(advantage(r["mine"], b) for b in r["baselines"].values()))
    return list(reversed(scored[-k:])), scored[:k]
