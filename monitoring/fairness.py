"""Group fairness of a scored dataset: a rate per group of a sensitive attribute, and the largest gap."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class GroupRate:
    group: str
    rate: float
    rows: int  # rows the rate is computed over (negatives for FPR, positives for TPR, all for flag rate)


@dataclass(frozen=True)
class FairnessResult:
    rate: str
    groups: tuple[GroupRate, ...]
    gap: float
    worst: tuple[str, str] | None  # (lowest group, highest group) among groups with enough rows
    skipped: tuple[str, ...]  # groups with fewer than min_rows


def group_rates(
    labels: pd.Series,
    scores: np.ndarray,
    groups: pd.Series,
    *,
    threshold: float = 0.5,
    rate: str = "false_positive_rate",
    min_rows: int = 30,
) -> FairnessResult:
    """``rate`` per group at ``threshold``; the gap is max - min over groups with at least ``min_rows``."""
    flagged = np.asarray(scores) >= threshold
    y = np.asarray(labels).astype(int)
    g = np.asarray(groups).astype(str)
    out: list[GroupRate] = []
    for name in sorted(set(g)):
        in_group = g == name
        if rate == "false_positive_rate":
            base = in_group & (y == 0)
        elif rate == "true_positive_rate":
            base = in_group & (y == 1)
        elif rate == "flag_rate":
            base = in_group
        else:
            raise ValueError(f"unknown fairness rate {rate!r}")
        n = int(base.sum())
        out.append(GroupRate(name, float(flagged[base].mean()) if n else 0.0, n))
    eligible = [r for r in out if r.rows >= min_rows]
    skipped = tuple(r.group for r in out if r.rows < min_rows)
    if len(eligible) < 2:
        return FairnessResult(rate, tuple(out), 0.0, None, skipped)
    low = min(eligible, key=lambda r: r.rate)
    high = max(eligible, key=lambda r: r.rate)
    return FairnessResult(rate, tuple(out), high.rate - low.rate, (low.group, high.group), skipped)
