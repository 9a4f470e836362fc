"""The autoscaler benchmark's trace sets and targets: pure functions over its result rows.

A row is one trace instance (trace, seed) x profile; each policy's run of it is a dict with at least
``bad``, ``replica_seconds`` and ``requests``. The targets:

1. Pareto: no baseline dominates tollfree (fewer-or-equal bad requests and fewer-or-equal
   replica-seconds, one of them strictly fewer).
2. Near the limit: tollfree's bad requests at most the trace's floor plus 1 % of its requests, and its
   replica-seconds at most 2x the clairvoyant bound under the same scale-down window (:func:`reach`);
   1.5x on the median row.
3. Kept: spike rows with >= 5x fewer bad requests than HPA, ramp rows at capacity in < 60 s, and the
   vertical axis within 20 % of the best fixed target after 3 cycles and steady.

The model's targets (:func:`model_targets`, judged apart on each set): no row dominated; bad requests at
most the start floor plus 1 % of the requests on every row; median replica-seconds at most 1.5x the bound
and none over 2.5x; and, on the rows with steps or bursts, bad requests over the start floor at most half
of the best baseline's over the same floor, at no more than 1.1x its replica-seconds.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

from simulator.policies import POLICIES, USER_VARIANTS

# every policy runs on every row; tollfree is judged against the others
ALL_POLICIES = POLICIES + USER_VARIANTS
BASELINES = tuple(p for p in ALL_POLICIES if p != "tollfree")

# Tune on these only (seed 0 of the traces every rule so far was judged on) ...
TUNING = tuple((t, 0) for t in ("azure_code", "azure_conv", "spike", "ramp", "diurnal", "onoff"))
# ... and report on these too, generated once, never tuned on: seeds 1-5 of the synthetic traces and of
# three shapes added for it (simulator/traces.py: bursty, sawtooth, flash)
HELD_OUT = tuple(
    (t, s) for t in ("spike", "ramp", "diurnal", "onoff", "bursty", "sawtooth", "flash") for s in range(1, 6)
)
SETS = {"tuning": TUNING, "held-out": HELD_OUT}

EXTRA_BAD_SHARE = 0.01  # bad requests allowed over the floor, as a share of the trace's requests
RS_RATIO_ROW = 2.0  # replica-seconds allowed, as a multiple of the clairvoyant bound, per row
RS_RATIO_MEDIAN = 1.5  # ... and on the median row
SPIKE_RATIO = 5.0
RAMP_S = 60.0
VERTICAL_BAND = 0.2
RS_RATIO_MAX = 2.5  # the model's targets: no row over this multiple of the bound
STEPPED = ("spike", "ramp", "onoff", "bursty", "flash")  # the trace shapes with steps or bursts
BEYOND_BAD = 0.5  # at most this share of the best baseline's bad requests over the start floor ...
BEYOND_RS = 1.1  # ... at no more than this multiple of its replica-seconds


def dominates(b: Mapping, t: Mapping) -> bool:
    """``b`` has fewer-or-equal bad requests and replica-seconds than ``t``, one of them strictly fewer."""
    return (
        b["bad"] <= t["bad"]
        and b["replica_seconds"] <= t["replica_seconds"]
        and (b["bad"] < t["bad"] or b["replica_seconds"] < t["replica_seconds"])
    )


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
    return {
        "dominated_by": dominating,
        "out_of_reach": [n for n in dominating if unreachable(baselines[n], r)],
        "floor_bad": r["floor_bad"],
        "bound_rs": r["bound_rs"],
        "start_bad": r.get("start_bad"),
        **near_limit(mine, r),
    }


def beyond_anchors(mine: Mapping, baselines: Mapping[str, Mapping], start_bad: int) -> dict:
    """Against the baseline with the fewest bad requests over the start floor: tollfree's excess at most
    ``BEYOND_BAD`` of its excess, at no more than ``BEYOND_RS`` its replica-seconds."""
    name, best = min(baselines.items(), key=lambda kv: (kv[1]["bad"], kv[1]["replica_seconds"]))
    over_mine, over_best = max(0, mine["bad"] - start_bad), max(0, best["bad"] - start_bad)
    ok = over_mine <= BEYOND_BAD * over_best and mine["replica_seconds"] <= BEYOND_RS * best["replica_seconds"]
    return {
        "best": name,
        "ok": ok,
        "detail": f"{over_mine:,} vs {name}'s {over_best:,} over the start floor, "
        f"{mine['replica_seconds'] / best['replica_seconds']:.2f}x its replica-s",
    }


def model_targets(rows: Sequence[Mapping]) -> dict:
    """The model's targets on one set's rows (each with ``mine``, ``baselines`` and :func:`row_checks`)."""
    ratios = [r["rs_ratio"] for r in rows]
    stepped = [r for r in rows if r["trace"] in STEPPED]
    beyond = [beyond_anchors(r["mine"], r["baselines"], r["start_bad"]) for r in stepped]
    return {
        "rows": len(rows),
        "not_dominated": sum(not r["dominated_by"] for r in rows),
        "within_start_floor": sum(r["extra_over_start"] <= EXTRA_BAD_SHARE for r in rows),
        "median_rs_ratio": statistics.median(ratios) if ratios else math.nan,
        "max_rs_ratio": max(ratios, default=math.nan),
        "median_ok": bool(ratios) and statistics.median(ratios) <= RS_RATIO_MEDIAN,
        "max_ok": bool(ratios) and max(ratios) <= RS_RATIO_MAX,
        "stepped": len(stepped),
        "beyond_anchors": sum(b["ok"] for b in beyond),
    }


def median_ratio(checks: Iterable[Mapping]) -> float:
    return statistics.median(c["rs_ratio"] for c in checks)


def spike_ratio(mine: Mapping, hpa: Mapping) -> float:
    """HPA's bad requests over tollfree's (tollfree's at least 1)."""
    return hpa["bad"] / max(1, mine["bad"])


def vertical_check(learned: Sequence[tuple[float, float]], best: float, cycles: int = 3) -> dict:
    """The learned target after ``cycles`` vertical cycles within the band of ``best``, and every later one."""
    after = [x for _, x in learned[cycles - 1 :]]
    if not after:
        return {"ok": False, "detail": "no cycles"}
    worst = max(abs(x / best - 1) for x in after)
    return {
        "ok": abs(after[0] / best - 1) <= VERTICAL_BAND and worst <= VERTICAL_BAND,
        "detail": f"best fixed {best:g}, after {cycles} cycles {after[0]:g}, later {min(after):g}..{max(after):g}",
    }


def advantage(mine: Mapping, b: Mapping) -> float:
    """How far tollfree is ahead of ``b`` on one row: log ratios of replica-seconds and of bad requests
    (each bad count plus 0.1 % of the requests, so a handful of bad requests does not read as infinite)."""
    eps = 0.001 * max(1, mine["requests"])
    return math.log(b["replica_seconds"] / max(mine["replica_seconds"], 1e-9)) + math.log(
        (b["bad"] + eps) / (mine["bad"] + eps)
    )


def extremes(rows: Sequence[Mapping], k: int = 3) -> tuple[list[Mapping], list[Mapping]]:
    """The ``k`` rows where tollfree wins most and the ``k`` where it loses most, by the advantage over its
    nearest baseline on the row (``rows``: each with ``mine`` and ``baselines``)."""
    scored = sorted(rows, key=lambda r: min(advantage(r["mine"], b) for b in r["baselines"].values()))
    return list(reversed(scored[-k:])), scored[:k]
