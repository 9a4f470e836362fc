"""The canary's checks, each of the challenger against the champion: latency, errors, accuracy, memory.

A threshold counts as crossed only when a test says so at level ``alpha``, never on a point estimate:
- latency: a bootstrap confidence bound of the quantile ratio (challenger / champion) beyond the
  threshold, and a one-sided Mann-Whitney test that the challenger's latencies are larger;
- errors: a one-sided binomial test that the challenger's error rate exceeds the threshold, and a
  one-sided Fisher test that it errs more often than the champion (errors the champion makes as often
  come from the inputs, not the challenger);
- accuracy: a bootstrap bound of the relative drop beyond the threshold;
- memory: a one-sided Kendall test of a rising trend, a growth over ``memory_growth``, and a champion
  that does not rise the same way.
Below the minimum sample sizes a check is ``insufficient`` ("not enough data yet"); a point estimate
beyond a warning without a significant test is ``inconclusive`` (more data settles it either way). Both
hold the canary where it is; a significant warning holds a step only for a bounded time
(``serving.registry.canary_steps``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from serving.endpoints.monitoring_settings import CanaryThresholds

OK, WARN, ROLLBACK = "ok", "warn", "rollback"
INSUFFICIENT, INCONCLUSIVE, PENDING = "insufficient", "inconclusive", "pending"


@dataclass(frozen=True)
class Check:
    metric: str
    status: str
    champion: float | None
    challenger: float | None
    change: float | None  # the compared quantity: a ratio - 1, a rate or a relative drop
    bound: float | None  # its confidence bound on the side that matters
    p_value: float | None
    n_champion: int
    n_challenger: int
    reason: str

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("champion", "challenger", "change", "bound", "p_value"):
            if out[key] is not None:
                out[key] = round(float(out[key]), 6)
        return out


def is_error(status: pd.Series) -> pd.Series:
    """Errors the endpoint is to blame for: 5xx and 429 (a 4xx is the caller's)."""
    return (status >= 500) | (status == 429)


def _rng(config: CanaryThresholds) -> np.random.Generator:
    return np.random.default_rng(config.seed)


def _resample(values: np.ndarray, config: CanaryThresholds, rng: np.random.Generator) -> np.ndarray:
    """``config.bootstrap`` resamples (rows) of ``values``, capped in length for memory."""
    if len(values) > config.max_bootstrap_rows:
        values = rng.choice(values, config.max_bootstrap_rows, replace=False)
    return values[rng.integers(0, len(values), size=(config.bootstrap, len(values)))]


def latency_check(
    metric: str,
    q: float,
    champion: np.ndarray,
    challenger: np.ndarray,
    warn: float,
    rollback: float | None,
    config: CanaryThresholds,
) -> Check:
    n_c, n_x = len(champion), len(challenger)
    if min(n_c, n_x) < config.min_requests:
        return Check(
            metric,
            INSUFFICIENT,
            None,
            None,
            None,
            None,
            None,
            n_c,
            n_x,
            f"not enough data yet: {n_x} challenger / {n_c} champion requests, need {config.min_requests} each",
        )
    base, cand = float(np.quantile(champion, q)), float(np.quantile(challenger, q))
    rng = _rng(config)
    boot_c = np.quantile(_resample(champion, config, rng), q, axis=1)
    boot_x = np.quantile(_resample(challenger, config, rng), q, axis=1)
    ratios = boot_x / np.maximum(boot_c, 1e-9)
    lower = float(np.quantile(ratios, config.alpha)) - 1.0
    change = cand / max(base, 1e-9) - 1.0
    p = float(stats.mannwhitneyu(challenger, champion, alternative="greater").pvalue)
    shifted = p < config.alpha
    figures = (
        f"{metric} {cand:.1f} ms vs {base:.1f} ms ({change:+.0%}, lower bound {lower:+.0%}, Mann-Whitney p={p:.3g})"
    )
    if rollback is not None and shifted and lower > rollback:
        status, why = ROLLBACK, f"{figures}: above +{rollback:.0%}"
    elif shifted and lower > warn:
        status, why = WARN, f"{figures}: above +{warn:.0%}"
    elif change > warn:
        status, why = INCONCLUSIVE, f"{figures}: above +{warn:.0%} but not significantly; waiting for more data"
    else:
        status, why = OK, figures
    return Check(metric, status, base, cand, change, lower, p, n_c, n_x, why)


def error_check(champion: pd.DataFrame, challenger: pd.DataFrame, config: CanaryThresholds) -> Check:
    n_c, n_x = len(champion), len(challenger)
    e_c, e_x = int(is_error(champion["status_code"]).sum()), int(is_error(challenger["status_code"]).sum())
    rate_c = e_c / n_c if n_c else None
    rate_x = e_x / n_x if n_x else None
    if n_x < config.min_error_requests or n_c == 0:
        return Check(
            "error_rate",
            INSUFFICIENT,
            rate_c,
            rate_x,
            rate_x,
            None,
            None,
            n_c,
            n_x,
            f"not enough data yet: {n_x} challenger requests, need {config.min_error_requests}",
        )
    assert rate_x is not None
    fisher = float(stats.fisher_exact([[e_x, n_x - e_x], [e_c, n_c - e_c]], alternative="greater").pvalue)
    p_rollback = float(stats.binomtest(e_x, n_x, config.error_rollback, alternative="greater").pvalue)
    p_warn = float(stats.binomtest(e_x, n_x, config.error_warn, alternative="greater").pvalue)
    upper = float(stats.binomtest(e_x, n_x).proportion_ci(1 - 2 * config.alpha).high)
    figures = f"error_rate {rate_x:.2%} ({e_x}/{n_x}) vs champion {rate_c:.2%} ({e_c}/{n_c}), Fisher p={fisher:.3g}"
    worse = fisher < config.alpha
    if worse and p_rollback < config.alpha:
        return Check(
            "error_rate",
            ROLLBACK,
            rate_c,
            rate_x,
            rate_x,
            upper,
            p_rollback,
            n_c,
            n_x,
            f"{figures}: above {config.error_rollback:.1%} (binomial p={p_rollback:.3g})",
        )
    if worse and p_warn < config.alpha:
        return Check(
            "error_rate",
            WARN,
            rate_c,
            rate_x,
            rate_x,
            upper,
            p_warn,
            n_c,
            n_x,
            f"{figures}: above {config.error_warn:.1%} (binomial p={p_warn:.3g})",
        )
    if n_x < config.min_requests:
        return Check(
            "error_rate",
            INSUFFICIENT,
            rate_c,
            rate_x,
            rate_x,
            upper,
            p_warn,
            n_c,
            n_x,
            f"not enough data yet: {figures}; need {config.min_requests} challenger requests",
        )
    if rate_x > config.error_warn and rate_x > (rate_c or 0.0):
        return Check(
            "error_rate",
            INCONCLUSIVE,
            rate_c,
            rate_x,
            rate_x,
            upper,
            p_warn,
            n_c,
            n_x,
            f"{figures}: above {config.error_warn:.1%} but not significantly; waiting for more data",
        )
    return Check("error_rate", OK, rate_c, rate_x, rate_x, upper, p_warn, n_c, n_x, figures)


def accuracy_check(champion: np.ndarray, challenger: np.ndarray, config: CanaryThresholds) -> Check:
    n_c, n_x = len(champion), len(challenger)
    if min(n_c, n_x) < config.min_labelled:
        status = INSUFFICIENT if config.require_labels else PENDING
        return Check(
            "accuracy",
            status,
            None,
            None,
            None,
            None,
            None,
            n_c,
            n_x,
            f"labels for {n_x} challenger / {n_c} champion rows, need {config.min_labelled} each",
        )
    acc_c, acc_x = float(champion.mean()), float(challenger.mean())
    drop = (acc_c - acc_x) / acc_c if acc_c > 0 else 0.0
    rng = _rng(config)
    boot_c = _resample(champion, config, rng).mean(axis=1)
    boot_x = _resample(challenger, config, rng).mean(axis=1)
    drops = (boot_c - boot_x) / np.maximum(boot_c, 1e-12)
    lower = float(np.quantile(drops, config.alpha))
    p = float((drops <= 0).mean())  # bootstrap p-value that the challenger is no worse
    figures = f"accuracy {acc_x:.2%} vs champion {acc_c:.2%} ({drop:+.1%} worse, lower bound {lower:+.1%})"
    if lower > config.accuracy_rollback:
        return Check(
            "accuracy",
            ROLLBACK,
            acc_c,
            acc_x,
            drop,
            lower,
            p,
            n_c,
            n_x,
            f"{figures}: more than {config.accuracy_rollback:.0%} worse",
        )
    if lower > config.accuracy_warn:
        return Check(
            "accuracy",
            WARN,
            acc_c,
            acc_x,
            drop,
            lower,
            p,
            n_c,
            n_x,
            f"{figures}: more than {config.accuracy_warn:.0%} worse",
        )
    if drop > config.accuracy_warn:
        return Check(
            "accuracy",
            INCONCLUSIVE,
            acc_c,
            acc_x,
            drop,
            lower,
            p,
            n_c,
            n_x,
            f"{figures}: more than {config.accuracy_warn:.0%} worse but not significantly; waiting for more labels",
        )
    return Check("accuracy", OK, acc_c, acc_x, drop, lower, p, n_c, n_x, figures)


def memory_trend(samples: pd.DataFrame) -> tuple[float, float]:
    """(one-sided Kendall p-value of a rising trend, relative growth first -> last) of RSS over time."""
    ordered = samples.sort_values("timestamp")
    rss = ordered["rss_mb"].to_numpy(dtype=float)
    if len(rss) < 2 or np.all(rss == rss[0]):
        return 1.0, 0.0
    t = pd.to_datetime(ordered["timestamp"], utc=True).astype("int64").to_numpy()
    p = float(stats.kendalltau(t, rss, alternative="greater").pvalue)
    slope = float(stats.theilslopes(rss, t).slope)
    growth = slope * float(t[-1] - t[0]) / max(float(np.median(rss)), 1e-9)
    return p, growth


def memory_check(champion: pd.DataFrame, challenger: pd.DataFrame, config: CanaryThresholds) -> Check:
    n_c, n_x = len(champion), len(challenger)
    if n_x < config.min_memory_samples:
        return Check(
            "memory_trend",
            PENDING,
            None,
            None,
            None,
            None,
            None,
            n_c,
            n_x,
            f"{n_x} memory samples of the challenger, need {config.min_memory_samples}",
        )
    p_x, growth_x = memory_trend(challenger)
    p_c, growth_c = memory_trend(champion) if n_c >= 2 else (1.0, 0.0)
    last_x = float(challenger.sort_values("timestamp")["rss_mb"].iloc[-1])
    last_c = float(champion.sort_values("timestamp")["rss_mb"].iloc[-1]) if n_c else None
    figures = (
        f"memory_trend: challenger RSS growth {growth_x:+.0%} (Kendall p={p_x:.3g}), "
        f"champion {growth_c:+.0%} (p={p_c:.3g})"
    )
    champion_rises = p_c < config.alpha and growth_c >= growth_x / 2
    if p_x < config.alpha and growth_x > config.memory_growth and not champion_rises:
        return Check(
            "memory_trend", ROLLBACK, last_c, last_x, growth_x, None, p_x, n_c, n_x, f"{figures}: rising steadily"
        )
    return Check("memory_trend", OK, last_c, last_x, growth_x, None, p_x, n_c, n_x, figures)
