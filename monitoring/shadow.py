"""The shadow phase's verdict: the challenger's answers to copies of requests against the champion's answers to
the same requests (paired by request id in the inference log), with the canary's rules.

Checks: p99 and p50 latency and the error rate with the canary's own tests and thresholds
(``monitoring.canary_checks``), each over the paired requests only, so both sides saw the same inputs; and the
agreement of the two answers: the share of pairs both answered whose predictions agree (every prediction equal;
numbers within ``agreement_tolerance``). Agreement warns below ``agreement_warn``; it rolls back when its upper
confidence bound (Wilson, ``alpha``) is below ``agreement_rollback``. Pure: the log's frame in, a verdict out.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import pandas as pd
from scipy import stats

from monitoring.canary import DEFAULT_THRESHOLDS, CanaryVerdict, decide
from monitoring.canary_checks import INSUFFICIENT, OK, ROLLBACK, WARN, Check, error_check, latency_check
from serving.endpoints.monitoring_settings import CanaryThresholds


def shadow_verdict(
    log: pd.DataFrame,
    champion: str,
    challenger: str,
    since: datetime,
    now: datetime,
    config: CanaryThresholds = DEFAULT_THRESHOLDS,
) -> CanaryVerdict:
    """``log``: the endpoint's inference log with shadow records (``read_inference_log(..., shadow=None)``)."""
    pairs = paired(log, champion, challenger, since, now)
    both_ok = pairs[(pairs["status_code_c"] == 200) & (pairs["status_code_x"] == 200)]
    lat_c, lat_x = (both_ok[f"latency_ms_{s}"].to_numpy(dtype=float) for s in ("c", "x"))
    statuses = {s: pairs[[f"status_code_{s}"]].rename(columns=lambda _: "status_code") for s in ("c", "x")}
    checks = (
        latency_check("p99_latency", 0.99, lat_c, lat_x, config.p99_warn, config.p99_rollback, config),
        latency_check("p50_latency", 0.50, lat_c, lat_x, config.p50_warn, None, config),
        error_check(statuses["c"], statuses["x"], config),
        agreement_check(both_ok["outputs_c"].tolist(), both_ok["outputs_x"].tolist(), config),
    )
    return decide(checks, since, now)


def paired(log: pd.DataFrame, champion: str, challenger: str, since: datetime, now: datetime) -> pd.DataFrame:
    """One row per request in [since, now) that the champion answered a client and the challenger a copy of:
    columns ``*_c`` (champion) and ``*_x`` (challenger) for status_code, latency_ms and outputs."""
    columns = ["request_id", "status_code", "latency_ms", "outputs"]
    if log.empty:
        return pd.DataFrame({f"{c}_{s}": [] for c in columns[1:] for s in ("c", "x")} | {"request_id": []})
    ts = pd.to_datetime(log["timestamp"], utc=True)
    window = log[(ts >= pd.Timestamp(since)) & (ts < pd.Timestamp(now))]
    shadow = window["shadow"].fillna(False).astype(bool) if "shadow" in window else pd.Series(False, window.index)
    client = window[~shadow & (window["served_entity"] == champion)][columns]
    copies = window[shadow & (window["served_entity"] == challenger)][columns]
    return client.merge(copies, on="request_id", suffixes=("_c", "_x"))


def agreement_check(champion: list[Any], challenger: list[Any], config: CanaryThresholds) -> Check:
    n = len(champion)
    if n < config.min_requests:
        return Check(
            "agreement",
            INSUFFICIENT,
            None,
            None,
            None,
            None,
            None,
            n,
            n,
            f"not enough data yet: {n} requests both answered, need {config.min_requests}",
        )
    agree = sum(_agree(a, b, config.agreement_tolerance) for a, b in zip(champion, challenger))
    rate = agree / n
    upper = _wilson_upper(agree, n, config.alpha)
    figures = f"agreement {rate:.1%} of {n} requests (upper bound {upper:.1%})"
    if upper < config.agreement_rollback:
        status, why = ROLLBACK, f"{figures}: below {config.agreement_rollback:.0%}"
    elif rate < config.agreement_warn:
        status, why = WARN, f"{figures}: below {config.agreement_warn:.0%}"
    else:
        status, why = OK, figures
    return Check("agreement", status, 1.0, rate, rate - 1.0, upper, None, n, n, why)


def _agree(first: Any, second: Any, tolerance: float) -> bool:
    """Whether two predictions JSON texts agree: the same shape, numbers within ``tolerance``, the rest equal."""
    try:
        a, b = orjson.loads(first), orjson.loads(second)
    except (TypeError, orjson.JSONDecodeError):
        return False
    flat_a, flat_b = _flat(a), _flat(b)
    if len(flat_a) != len(flat_b):
        return False
    for x, y in zip(flat_a, flat_b):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y))
        if not (abs(x - y) <= tolerance if numbers else x == y):
            return False
    return True


def _flat(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [x for key in sorted(value) for x in _flat(value[key])]
    if isinstance(value, list):
        return [x for item in value for x in _flat(item)]
    return [value]


def _wilson_upper(successes: int, n: int, alpha: float) -> float:
    z = float(stats.norm.ppf(1 - alpha))
    p = successes / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float(np.clip((centre + spread) / (1 + z * z / n), 0.0, 1.0))
