"""The canary verdict, pure: frames and a clock in, a decision out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pytest

from monitoring.canary import canary_verdict
from serving.endpoints.monitoring_settings import CanaryThresholds

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
SINCE = NOW - timedelta(minutes=10)
SMALL = CanaryThresholds(min_requests=100, min_labelled=100)


def _requests(
    rng: np.random.Generator, entity: str, n: int, median_ms: float = 5.0, error_rate: float = 0.0
) -> pd.DataFrame:
    offsets = rng.uniform(0, 600, n)
    status = np.where(rng.random(n) < error_rate, 500, 200)
    return pd.DataFrame(
        {
            "timestamp": [SINCE + timedelta(seconds=float(s)) for s in offsets],
            "served_entity": entity,
            "status_code": status,
            "latency_ms": rng.lognormal(np.log(median_ms), 0.35, n),
        }
    )


def _log(seed: int, n_champion: int = 2000, n_challenger: int = 300, **challenger: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.concat(
        [_requests(rng, "champ", n_champion), _requests(rng, "chall", n_challenger, **challenger)], ignore_index=True
    )


def _labels(seed: int, acc_champion: float, acc_challenger: float, n: int = 400) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for entity, acc in (("champ", acc_champion), ("chall", acc_challenger)):
        rows.append(
            pd.DataFrame(
                {"timestamp": SINCE + timedelta(seconds=5), "served_entity": entity, "correct": rng.random(n) < acc}
            )
        )
    return pd.concat(rows, ignore_index=True)


def test_twenty_clean_resamples_raise_no_alarm():
    decisions = []
    for seed in range(20):
        verdict = canary_verdict(_log(seed), "champ", "chall", SINCE, NOW, SMALL, labels=_labels(seed, 0.95, 0.95))
        decisions.append(verdict.decision)
        assert verdict.decision not in ("warn", "rollback"), verdict.reason
    assert decisions.count("ok") >= 15, decisions  # the rest wait for data; none cries wolf


def test_a_slow_challenger_is_rolled_back_naming_p99():
    verdict = canary_verdict(_log(1, median_ms=12.0), "champ", "chall", SINCE, NOW, SMALL)
    assert verdict.decision == "rollback"
    assert verdict.check("p99_latency").status == "rollback" and "p99_latency" in verdict.reason
    assert verdict.check("p99_latency").change > 0.5


def test_a_moderately_slower_challenger_only_warns():
    verdict = canary_verdict(_log(2, n_challenger=1500, median_ms=6.6), "champ", "chall", SINCE, NOW, SMALL)
    assert verdict.check("p99_latency").status == "warn" and verdict.decision == "warn"


def test_a_failing_challenger_is_rolled_back_before_latency_has_enough_data():
    verdict = canary_verdict(_log(3, n_challenger=40, error_rate=0.1), "champ", "chall", SINCE, NOW, SMALL)
    assert verdict.check("p99_latency").status == "insufficient"
    assert verdict.check("error_rate").status == "rollback" and verdict.decision == "rollback"


def test_errors_the_champion_makes_as_often_are_not_the_challengers_fault():
    rng = np.random.default_rng(4)
    log = pd.concat([_requests(rng, "champ", 2000, error_rate=0.02), _requests(rng, "chall", 300, error_rate=0.02)])
    assert canary_verdict(log, "champ", "chall", SINCE, NOW, SMALL).check("error_rate").status != "rollback"


def test_one_error_in_a_few_hundred_waits_instead_of_guessing():
    log = _log(5, n_challenger=300)
    log.loc[log.index[-1], "status_code"] = 503
    check = canary_verdict(log, "champ", "chall", SINCE, NOW, SMALL).check("error_rate")
    assert check.status == "inconclusive" and "not significantly" in check.reason


def test_too_few_requests_is_not_enough_data_yet():
    verdict = canary_verdict(_log(6, n_challenger=30), "champ", "chall", SINCE, NOW, SMALL)
    assert verdict.decision == "insufficient" and "not enough data yet" in verdict.reason


def test_requests_outside_the_window_do_not_count():
    log = _log(7)
    verdict = canary_verdict(log, "champ", "chall", SINCE + timedelta(minutes=9, seconds=59), NOW, SMALL)
    assert verdict.decision == "insufficient"


def test_accuracy_drop_rolls_back_and_small_drops_wait_for_labels():
    bad = canary_verdict(_log(8), "champ", "chall", SINCE, NOW, SMALL, labels=_labels(8, 0.95, 0.80))
    assert bad.check("accuracy").status == "rollback" and bad.decision == "rollback"
    pending = canary_verdict(_log(8), "champ", "chall", SINCE, NOW, SMALL, labels=_labels(8, 0.95, 0.80, n=20))
    assert pending.check("accuracy").status == "pending" and pending.decision == "ok"
    required = CanaryThresholds(min_requests=100, min_labelled=100, require_labels=True)
    assert canary_verdict(_log(8), "champ", "chall", SINCE, NOW, required).decision == "insufficient"


def _memory(entity: str, values: list[float]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "timestamp": [SINCE + timedelta(minutes=i) for i in range(len(values))],
            "served_entity": entity,
            "rss_mb": values,
        }
    )


def test_memory_rising_steadily_rolls_back_and_a_flat_or_shared_rise_does_not():
    flat = _memory("champ", [400, 401, 399, 400, 402, 400, 401, 400])
    rising = _memory("chall", [400, 430, 455, 490, 520, 560, 590, 630])
    verdict = canary_verdict(_log(9), "champ", "chall", SINCE, NOW, SMALL, memory=pd.concat([flat, rising]))
    assert verdict.check("memory_trend").status == "rollback" and verdict.decision == "rollback"
    both = pd.concat([_memory("champ", [400, 430, 455, 490, 520, 560, 590, 630]), rising])
    assert (
        canary_verdict(_log(9), "champ", "chall", SINCE, NOW, SMALL, memory=both).check("memory_trend").status == "ok"
    )
    noisy = _memory("chall", [400, 420, 395, 415, 398, 421, 402, 410])
    assert (
        canary_verdict(_log(9), "champ", "chall", SINCE, NOW, SMALL, memory=pd.concat([flat, noisy]))
        .check("memory_trend")
        .status
        == "ok"
    )


def test_thresholds_from_a_mapping_refuse_unknown_keys():
    assert CanaryThresholds.from_mapping({"p99_rollback": 0.3}).p99_rollback == 0.3
    with pytest.raises(ValueError, match="p99_rollbak"):
        CanaryThresholds.from_mapping({"p99_rollbak": 0.3})
