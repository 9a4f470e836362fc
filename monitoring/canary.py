"""Canary verdict: the challenger against the champion on the same endpoint over the same window.

Pure: frames of the inference log (and of labelled requests and memory samples) in, a verdict out.
Thresholds default to Databricks' production guidance: p99 latency more than +20 % is a warning and more
than +50 % a rollback; error rate above 0.1 % a warning and above 0.5 % a rollback; accuracy more than
2 % worse a warning and more than 5 % a rollback; memory rising steadily a rollback.
Each check's test: ``monitoring.canary_checks``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from monitoring.canary_checks import (
    INCONCLUSIVE,
    INSUFFICIENT,
    OK,
    ROLLBACK,
    WARN,
    Check,
    accuracy_check,
    error_check,
    latency_check,
    memory_check,
)
from serving.endpoints.monitoring_settings import CanaryThresholds

DEFAULT_THRESHOLDS = CanaryThresholds()  # frozen: one instance serves every call


@dataclass(frozen=True)
class CanaryVerdict:
    decision: str  # ok | warn | rollback | insufficient (not enough data yet, or not yet significant)
    checks: tuple[Check, ...]
    since: datetime
    until: datetime
    reason: str

    def check(self, metric: str) -> Check:
        return next(c for c in self.checks if c.metric == metric)

    def table(self) -> list[dict[str, Any]]:
        return [c.row() for c in self.checks]


def _labelled_correct(labels: pd.DataFrame | None, entity: str) -> np.ndarray:
    if labels is None or labels.empty:
        return np.zeros(0, dtype=float)
    rows = labels[labels["served_entity"] == entity]
    return rows["correct"].to_numpy(dtype=float)


def _memory_rows(memory: pd.DataFrame | None, entity: str) -> pd.DataFrame:
    if memory is None or memory.empty:
        return pd.DataFrame({"timestamp": pd.Series(dtype="datetime64[ns, UTC]"), "rss_mb": pd.Series(dtype=float)})
    return memory[memory["served_entity"] == entity]


def canary_verdict(
    log: pd.DataFrame,
    champion: str,
    challenger: str,
    since: datetime,
    now: datetime,
    config: CanaryThresholds = DEFAULT_THRESHOLDS,
    labels: pd.DataFrame | None = None,
    memory: pd.DataFrame | None = None,
) -> CanaryVerdict:
    """Compare the served entities ``challenger`` and ``champion`` over requests in [since, now).

    ``log``: inference-log rows (timestamp, served_entity, status_code, latency_ms); ``labels``: one row
    per labelled served row (timestamp of the request, served_entity, correct); ``memory``: RSS samples
    (timestamp, served_entity, rss_mb) over the canary so far.
    """
    ts = pd.to_datetime(log["timestamp"], utc=True) if not log.empty else pd.Series(dtype="datetime64[ns, UTC]")
    window = log[(ts >= pd.Timestamp(since)) & (ts < pd.Timestamp(now))] if not log.empty else log
    if labels is not None and not labels.empty:
        lts = pd.to_datetime(labels["timestamp"], utc=True)
        labels = labels[(lts >= pd.Timestamp(since)) & (lts < pd.Timestamp(now))]
    side = {
        name: window[window["served_entity"] == name] if not window.empty else window for name in (champion, challenger)
    }

    def ok_latency(name: str) -> np.ndarray:
        rows = side[name]
        return (
            rows.loc[rows["status_code"] == 200, "latency_ms"].to_numpy(dtype=float) if not rows.empty else np.zeros(0)
        )

    lat_c, lat_x = ok_latency(champion), ok_latency(challenger)
    empty = pd.DataFrame({"status_code": pd.Series(dtype=int)})
    checks = (
        latency_check("p99_latency", 0.99, lat_c, lat_x, config.p99_warn, config.p99_rollback, config),
        latency_check("p50_latency", 0.50, lat_c, lat_x, config.p50_warn, None, config),
        error_check(
            side[champion] if not side[champion].empty else empty,
            side[challenger] if not side[challenger].empty else empty,
            config,
        ),
        accuracy_check(_labelled_correct(labels, champion), _labelled_correct(labels, challenger), config),
        memory_check(_memory_rows(memory, champion), _memory_rows(memory, challenger), config),
    )
    return decide(checks, since, now)


def decide(checks: tuple[Check, ...], since: datetime, now: datetime) -> CanaryVerdict:
    def named(status: str) -> list[Check]:
        return [c for c in checks if c.status == status]

    def reasons(held: list[Check]) -> str:
        return "; ".join(dict.fromkeys(c.reason for c in held))  # p50 and p99 may wait for the same data

    if named(ROLLBACK):
        return CanaryVerdict(ROLLBACK, checks, since, now, reasons(named(ROLLBACK)))
    if named(WARN):
        return CanaryVerdict(WARN, checks, since, now, reasons(named(WARN)))
    waiting = named(INSUFFICIENT) + named(INCONCLUSIVE)
    if waiting:  # "not enough data yet": no alarm, no move
        return CanaryVerdict(INSUFFICIENT, checks, since, now, reasons(waiting))
    return CanaryVerdict(OK, checks, since, now, "every check within its thresholds")
