"""The shadow phase's verdict over an inference log: requests paired by id, agreement of the two answers, and
the canary's latency and error checks on the pairs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from monitoring.shadow import agreement_check, paired, shadow_verdict
from serving.endpoints.monitoring_settings import CanaryThresholds

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
CONFIG = CanaryThresholds(min_requests=50, min_error_requests=20)


def _log(n: int, disagree: float = 0.0, shadow_errors: float = 0.0, slower: float = 1.0) -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for i in range(n):
        at = T0 + timedelta(seconds=i)
        latency = float(rng.uniform(1, 3))
        rows.append((f"r{i}", at, "a", 200, latency, "[0.2, 1]", None))
        status = 500 if i < n * shadow_errors else 200
        answer = "[0.9, 0]" if i >= n * (1 - disagree) else "[0.25, 1]"
        rows.append((f"r{i}", at, "b", status, latency * slower, answer if status == 200 else None, True))
    rows.append(("lone", T0, "b", 200, 1.0, "[1]", True))  # a copy with no client record of its id
    columns = ["request_id", "timestamp", "served_entity", "status_code", "latency_ms", "outputs", "shadow"]
    return pd.DataFrame(rows, columns=columns)


def test_pairs_are_the_champions_client_answers_and_the_challengers_copies_of_the_same_requests() -> None:
    pairs = paired(_log(10), "a", "b", T0, T0 + timedelta(hours=1))
    assert len(pairs) == 10 and set(pairs["outputs_x"]) == {"[0.25, 1]"}


@pytest.mark.parametrize(
    ("log", "decision", "metric"),
    [
        (_log(300), "ok", None),
        (_log(300, disagree=0.05), "ok", None),  # 95 % agree: above the 90 % warning
        (_log(300, disagree=0.2), "warn", "agreement"),
        (_log(300, disagree=0.6), "rollback", "agreement"),
        (_log(300, shadow_errors=0.05), "rollback", "error_rate"),
        (_log(300, slower=3.0), "rollback", "p99_latency"),
        (_log(20), "insufficient", "agreement"),
    ],
)
def test_the_verdict_follows_the_canarys_rules_on_the_paired_requests(log, decision, metric) -> None:  # type: ignore[no-untyped-def]
    verdict = shadow_verdict(log, "a", "b", T0, T0 + timedelta(hours=1), CONFIG)
    assert verdict.decision == decision, verdict.reason
    if metric is not None:
        assert verdict.check(metric).status == decision


def test_answers_agree_within_the_tolerance_and_with_the_same_shape_only() -> None:
    check = agreement_check(["[0.2]", "[1, 2]", '{"p": [0.5]}'], ["[0.25]", "[1]", '{"p": [0.55]}'], CONFIG)
    assert check.status == "insufficient"
    loose = CanaryThresholds(min_requests=1, agreement_tolerance=0.1)
    assert agreement_check(["[0.2]", '{"p": [0.5]}'], ["[0.25]", '{"p": [0.55]}'], loose).challenger == 1.0
    assert agreement_check(["[1, 2]", '["x"]'], ["[1]", '["y"]'], loose).challenger == 0.0
