"""Distribution drift of served features against a reference, with Evidently, and the run's verdict.

Each column is scored by the explicit method its kind gets in ``DriftConfig`` (Evidently otherwise switches
method at 1000 reference rows); results are read by metric type and column, never by position.

Two kinds of method, two meanings of a threshold:
- p-value methods (the defaults: Evidently's two-sample Kolmogorov-Smirnov ``ks`` for numbers, the
  chi-square test of homogeneity ``chi2_contingency`` registered below for categories). Both count the
  sampling noise of both windows, so a p-value means the same for 150 rows as for 100,000. The p-values of
  every column are corrected together (``DriftConfig.correction``, Holm by default), so a column's threshold
  is a family-wise false-alarm rate: on clean traffic a run names a column at most that often, however many
  columns the model has.
- distances (``psi``, ``wasserstein``, ``jensenshannon``, ...): a column drifts when its distance reaches the
  threshold, uncorrected. Their spread on clean traffic grows as windows shrink and columns add up, so their
  false-alarm rate is not bounded (``benchmarks/drift_false_alarms.py`` measures it).
The run drifts (``DriftResult.dataset_drift``, what ``flows.skew`` fails on) when at least one column drifts
and at least ``drift_share`` of the columns do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import pandas as pd

from serving.endpoints.monitoring_settings import P_VALUE_METHODS, DriftConfig

CHI2_CONTINGENCY = "chi2_contingency"  # one of P_VALUE_METHODS: drift when the score is below the threshold
MIN_EXPECTED = 5.0  # Cochran's rule for the chi-square approximation
DEFAULT_DRIFT = DriftConfig()  # frozen: one instance serves every call


@dataclass(frozen=True)
class ColumnDrift:
    column: str
    method: str
    score: float
    threshold: float
    drifted: bool
    adjusted: float | None = None  # a p-value method's p-value after the correction across columns


@dataclass(frozen=True)
class DriftResult:
    columns: tuple[ColumnDrift, ...]
    drift_share: float
    dataset_drift: bool  # the run's verdict: at least one column drifted and at least the configured share
    reference_rows: int
    current_rows: int
    snapshot: Any = field(repr=False, compare=False, default=None)

    def drifted_columns(self) -> list[str]:
        return [c.column for c in self.columns if c.drifted]

    def findings(self, label: str) -> list[str]:
        """What fails the run: every drifted column, when the run drifts by the settings; else nothing."""
        return [f"drift {label}:{c}" for c in self.drifted_columns()] if self.dataset_drift else []

    def table(self) -> list[dict[str, Any]]:
        return [
            {
                "column": c.column,
                "method": c.method,
                "score": round(c.score, 6),
                "adjusted": None if c.adjusted is None else round(c.adjusted, 6),
                "threshold": c.threshold,
                "drifted": c.drifted,
            }
            for c in self.columns
        ]


def is_drift(method: str, score: float, threshold: float) -> bool:
    return score < threshold if method in P_VALUE_METHODS else score >= threshold


def _chi2_contingency(
    reference: pd.Series, current: pd.Series, feature_type: Any, threshold: float
) -> tuple[float, bool]:
    """Chi-square test of homogeneity of the two windows' category counts (scipy's ``chi2_contingency``).

    Evidently's own ``chisquare`` fits the current counts to the reference's shares as if those were exact,
    so a small reference against a large window alarms far above its threshold; this test counts both
    windows' noise. Categories expected fewer than 5 times in either window are pooled into one (Cochran's
    rule for the approximation); a single category left is no evidence of drift (p = 1)."""
    from scipy.stats import chi2_contingency

    counts = pd.concat([reference.value_counts(), current.value_counts()], axis=1).fillna(0).to_numpy().T
    expected = counts.sum(axis=1, keepdims=True) * counts.sum(axis=0) / counts.sum()
    rare = (expected < MIN_EXPECTED).any(axis=0)
    table = np.column_stack([counts[:, ~rare], counts[:, rare].sum(axis=1)]) if rare.any() else counts
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0, False
    p_value = float(chi2_contingency(table, correction=False).pvalue)
    return p_value, p_value < threshold


@cache
def _register_chi2_contingency() -> None:
    """Make ``chi2_contingency`` a method Evidently's ``ValueDrift`` knows by name (once per process)."""
    from evidently.legacy.calculations.stattests.registry import StatTest, register_stattest
    from evidently.legacy.core import ColumnType

    register_stattest(
        StatTest(
            name=CHI2_CONTINGENCY,
            display_name="chi-square test of homogeneity p_value",
            allowed_feature_types=[ColumnType.Categorical],
            default_threshold=0.005,
        ),
        _chi2_contingency,
    )


def _method_for(series: pd.Series, config: DriftConfig) -> tuple[str, float, str]:
    if pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series):
        return config.numeric_method, config.numeric_threshold, "num"
    return config.categorical_method, config.categorical_threshold, "cat"


def _stattest_scores(
    reference: pd.DataFrame, current: pd.DataFrame, methods: dict[str, tuple[str, float, str]]
) -> dict[str, float]:
    """Each column's score from the Evidently stat test the report's ``ValueDrift`` calls, after the same
    cleaning (infinities and missing values dropped), without building the report."""
    from evidently.legacy.calculations.stattests.registry import get_stattest
    from evidently.legacy.core import ColumnType

    scores = {}
    for column, (method, threshold, kind) in methods.items():
        ref = reference[column].replace([-np.inf, np.inf], np.nan).dropna()
        cur = current[column].replace([-np.inf, np.inf], np.nan).dropna()
        if ref.empty or cur.empty:
            raise ValueError(
                f"drift column {column!r} has no value in the {'reference' if ref.empty else 'current'} data"
            )
        column_type = ColumnType(kind)
        scores[column] = float(
            get_stattest(ref, cur, column_type, method)(ref, cur, column_type, threshold).drift_score
        )
    return scores


def _report(
    reference: pd.DataFrame, current: pd.DataFrame, methods: dict[str, tuple[str, float, str]], shown: dict[str, float]
) -> tuple[dict[str, float], Any]:
    """Evidently's report of every column (its HTML is the run's report) and the scores read from it. Each
    column is shown against ``shown``: a p-value method's threshold over the number of columns tested (the
    Bonferroni level), so the report never marks a column the verdict does not name."""
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import ValueDrift

    definition = DataDefinition(
        numerical_columns=[c for c, m in methods.items() if m[2] == "num"],
        categorical_columns=[c for c, m in methods.items() if m[2] == "cat"],
    )
    report = Report([ValueDrift(column=c, method=m, threshold=shown[c]) for c, (m, _, _) in methods.items()])
    snapshot = report.run(
        Dataset.from_pandas(current[list(methods)], data_definition=definition),
        Dataset.from_pandas(reference[list(methods)], data_definition=definition),
    )
    scores: dict[str, float] = {}
    for metric in snapshot.dict()["metrics"]:
        cfg = metric["config"]
        if cfg.get("type", "").endswith(":ValueDrift"):
            scores[cfg["column"]] = float(metric["value"])
    return scores, snapshot


def corrected(p_values: dict[str, float], thresholds: dict[str, float], correction: str) -> dict[str, float]:
    """The p-values adjusted for testing them together, on each column's own scale: a column drifts when its
    adjusted p-value is below its threshold. ``bonferroni`` multiplies each by the number of columns; ``holm``
    steps down from the smallest, multiplying each by the number of columns not yet passed (as many columns
    named as Bonferroni or more, the same false-alarm bound). Unequal thresholds (numbers and categories set
    apart) weight the columns: each p-value is divided by its threshold before the correction, so a clean run
    names a column at most as often as the largest threshold. The same adjustment as statsmodels'
    ``multipletests``, whose Holm runs a full garbage collection per call (0.3 s in a process holding Evidently)."""
    if correction == "none" or not p_values:
        return dict(p_values)
    names = list(p_values)
    levels = np.array([thresholds[c] for c in names])
    ratios = np.array([p_values[c] for c in names]) / levels
    if correction == "bonferroni":
        scaled = ratios * len(names)
    else:
        order = np.argsort(ratios, kind="stable")
        scaled = np.empty(len(names))
        scaled[order] = np.maximum.accumulate(ratios[order] * np.arange(len(names), 0, -1))
    return {c: float(min(1.0, s * level)) for c, s, level in zip(names, scaled, levels)}


def judge(
    methods: dict[str, tuple[str, float, str]], scores: dict[str, float], config: DriftConfig
) -> tuple[tuple[ColumnDrift, ...], float, bool]:
    """Each column's verdict (p-values corrected together, distances as they are), the drifted share and
    the run's verdict under ``config.drift_share``."""
    tested = {c: scores[c] for c, (m, _, _) in methods.items() if m in P_VALUE_METHODS}
    adjusted = corrected(tested, {c: methods[c][1] for c in tested}, config.correction)
    columns = tuple(
        ColumnDrift(c, m, scores[c], t, is_drift(m, adjusted.get(c, scores[c]), t), adjusted.get(c))
        for c, (m, t, _) in methods.items()
    )
    drifted = sum(c.drifted for c in columns)
    share = drifted / len(columns) if columns else 0.0
    return columns, share, drifted > 0 and share >= config.drift_share


def compute_drift(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    columns: list[str],
    config: DriftConfig = DEFAULT_DRIFT,
    report: bool = False,
) -> DriftResult:
    """Score each column with its explicit method and judge the run. With ``report``, the scores are read from
    Evidently's report, kept as ``snapshot`` for its HTML; without, from the same stat tests called directly."""
    missing = [c for c in columns if c not in reference.columns or c not in current.columns]
    if missing:
        raise ValueError(f"drift columns missing from the reference or current data: {', '.join(missing)}")
    if reference.empty or current.empty:
        raise ValueError(f"drift needs rows on both sides: reference {len(reference)}, current {len(current)}")
    _register_chi2_contingency()
    methods = {c: _method_for(reference[c], config) for c in columns}
    tests = sum(m in P_VALUE_METHODS for m, _, _ in methods.values())
    shown = {
        c: t / tests if m in P_VALUE_METHODS and config.correction != "none" else t for c, (m, t, _) in methods.items()
    }
    snapshot = None
    if report:
        scores, snapshot = _report(reference, current, methods, shown)
    else:
        scores = _stattest_scores(reference, current, methods)
    results, share, drift = judge(methods, scores, config)
    return DriftResult(results, share, drift, len(reference), len(current), snapshot)
