"""Distribution drift of served features against the training data, with Evidently.

Methods are explicit (Evidently otherwise switches method at 1000 reference rows), and results are
read by metric type and column, never by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from serving.endpoints.monitoring import DriftConfig

# For these methods the score is a p-value: drift when it falls below the threshold.
P_VALUE_METHODS = frozenset(
    {"ks", "chisquare", "z", "t_test", "mannw", "anderson", "cramer_von_mises", "fisher_exact", "epps_singleton", "g_test"}
)


@dataclass(frozen=True)
class ColumnDrift:
    column: str
    method: str
    score: float
    threshold: float
    drifted: bool


@dataclass(frozen=True)
class DriftResult:
    columns: tuple[ColumnDrift, ...]
    drift_share: float
    dataset_drift: bool
    reference_rows: int
    current_rows: int
    snapshot: Any = field(repr=False, compare=False, default=None)

    def drifted_columns(self) -> list[str]:
        return [c.column for c in self.columns if c.drifted]

    def table(self) -> list[dict[str, Any]]:
        return [
            {"column": c.column, "method": c.method, "score": round(c.score, 6), "threshold": c.threshold, "drifted": c.drifted}
            for c in self.columns
        ]


def is_drift(method: str, score: float, threshold: float) -> bool:
    return score < threshold if method in P_VALUE_METHODS else score >= threshold


def _method_for(series: pd.Series, config: DriftConfig) -> tuple[str, float]:
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return config.numeric_method, config.numeric_threshold
    return config.categorical_method, config.categorical_threshold


def compute_drift(
    reference: pd.DataFrame, current: pd.DataFrame, columns: list[str], config: DriftConfig = DriftConfig()
) -> DriftResult:
    """Score each column with its explicit method; ``snapshot`` holds Evidently's report for HTML."""
    from evidently import Report
    from evidently.metrics import ValueDrift

    missing = [c for c in columns if c not in reference.columns or c not in current.columns]
    if missing:
        raise ValueError(f"drift columns missing from the reference or current data: {', '.join(missing)}")
    if reference.empty or current.empty:
        raise ValueError(f"drift needs rows on both sides: reference {len(reference)}, current {len(current)}")
    methods = {c: _method_for(reference[c], config) for c in columns}
    report = Report([ValueDrift(column=c, method=m, threshold=t) for c, (m, t) in methods.items()])
    snapshot = report.run(current[columns], reference[columns])
    scores: dict[str, float] = {}
    for metric in snapshot.dict()["metrics"]:
        cfg = metric["config"]
        if cfg.get("type", "").endswith(":ValueDrift"):
            scores[cfg["column"]] = float(metric["value"])
    results = tuple(
        ColumnDrift(c, m, scores[c], t, is_drift(m, scores[c], t)) for c, (m, t) in methods.items()
    )
    share = sum(r.drifted for r in results) / len(results)
    return DriftResult(results, share, share >= config.drift_share, len(reference), len(current), snapshot)
