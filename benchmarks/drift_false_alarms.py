"""How often the drift verdict alarms on clean traffic, and how often it catches a real shift.

    python -m benchmarks.drift_false_alarms [--runs 1000] [--shift-runs 200] [--scenario NAME ...]
                                            [--shift-sd 0.5] [--alarm verdict|any-column]
                                            [--drift JSON] [--engine fast|report] [--json]

Every run draws a reference and a current window from one distribution (clean traffic) and asks the
verdict whether the run drifts, with the endpoint's default drift settings (``DriftConfig()``) or
``--drift``. A clean run that alarms is a false alarm; a run whose current window has 3 numeric columns
moved by half their standard deviation (``--shift-sd``) and does not alarm is a miss. The moved columns
have no hard edge where they move (a bounded column moved past its bound is caught from a few rows).
Scenarios (reference rows / current rows):

- ``reported``: the case that was reported. scikit-learn's breast-cancer rows (30 numeric columns) drawn with
  replacement, plus a logistic regression's probability as the ``prediction`` column (31 columns);
  the first served window (1,000 rows) against the 153 rows a rolled-back challenger served after it.
- ``small``, ``medium``, ``large``: 32 numeric columns of mixed shapes (normal, log-normal, gamma, beta,
  Student t with 3 degrees of freedom, Poisson counts with ties, bimodal mixtures) and 4 categorical ones
  (3 to 20 levels, some rare), a 1,000-row first served window against 200, 1,000 and 10,000 rows.
- ``training``: the same columns, a 10,000-row training frame against 10,000 rows.

The verdict is ``monitoring.drift.compute_drift``'s ``dataset_drift`` (what ``flows.skew`` fails a run on).
``--engine fast`` (default) scores the columns with Evidently's stat tests directly (``report=False``:
the same functions the report's ``ValueDrift`` calls, without building the HTML report);
``--engine report`` builds the report too, as the flow does (about 1-3 s a run).
Prints, per scenario, the false-alarm rate with its exact (Clopper-Pearson) 95 % interval, the detection
rate, and the share of detections that named no innocent column; progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from benchmarks.common import Provenance, log

SHIFT_SD = 0.5
SHIFTED = ("normal_0", "lognormal_0", "student_0")  # no hard edge where they move: K-S gets no easy support shift
VERDICT_CODE = ("monitoring/drift.py", "serving/endpoints/monitoring_settings.py")  # what the measured verdict runs
REPORTED_SHIFTED = ("mean_radius", "worst_texture", "mean_smoothness")


def _synthetic(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """32 numeric columns of mixed shapes and 4 categorical ones, ``n`` rows drawn from one fixed distribution."""
    columns: dict[str, Any] = {}
    for i in range(8):
        columns[f"normal_{i}"] = rng.normal(10.0 * i, 1.0 + i, n)
    for i in range(6):
        columns[f"lognormal_{i}"] = rng.lognormal(1.0 + 0.3 * i, 0.5 + 0.15 * i, n)
    for i in range(4):
        columns[f"gamma_{i}"] = rng.gamma(1.0 + i, 2.0, n)
    for i in range(4):
        columns[f"beta_{i}"] = rng.beta(2.0 + i, 30.0, n)
    for i in range(4):
        columns[f"student_{i}"] = rng.standard_t(3, n) * (1 + i)
    for i in range(3):
        columns[f"count_{i}"] = rng.poisson(0.5 + 3 * i, n)  # integers with many ties
    for i in range(3):
        mode = rng.random(n) < 0.3
        columns[f"bimodal_{i}"] = np.where(mode, rng.normal(-2.0 - i, 0.5, n), rng.normal(3.0 + i, 1.0, n))
    for name, levels in (("channel", 3), ("region", 5), ("device", 8), ("merchant_type", 20)):
        weights = 1.0 / np.arange(1, levels + 1) ** 1.2  # Zipf-like: the last levels are rare
        columns[name] = rng.choice([f"{name}_{j}" for j in range(levels)], n, p=weights / weights.sum())
    return pd.DataFrame(columns)


@cache
def _synthetic_sd() -> dict[str, float]:
    """The population's standard deviation of each shifted column, from a large sample."""
    big = _synthetic(np.random.default_rng(12345), 200_000)
    return {c: float(big[c].std()) for c in SHIFTED}


@cache
def _breast_cancer() -> pd.DataFrame:
    """The 569 breast-cancer rows with a logistic regression's probability as the ``prediction`` column."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    data = load_breast_cancer(as_frame=True)
    rows = data.data.rename(columns=lambda c: c.replace(" ", "_"))
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000)).fit(rows, data.target)
    return rows.assign(prediction=model.predict_proba(rows)[:, 1])


@dataclass(frozen=True)
class Scenario:
    name: str
    reference_rows: int
    current_rows: int
    draw: Callable[[np.random.Generator, int], pd.DataFrame]
    shifted: tuple[str, ...]
    sd: Callable[[], dict[str, float]]


def _resampled(rng: np.random.Generator, n: int) -> pd.DataFrame:
    rows = _breast_cancer()
    return rows.iloc[rng.integers(0, len(rows), n)].reset_index(drop=True)


SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "reported",
            1000,
            153,
            _resampled,
            REPORTED_SHIFTED,
            lambda: {c: float(_breast_cancer()[c].std()) for c in REPORTED_SHIFTED},
        ),
        Scenario("small", 1000, 200, _synthetic, SHIFTED, _synthetic_sd),
        Scenario("medium", 1000, 1000, _synthetic, SHIFTED, _synthetic_sd),
        Scenario("large", 1000, 10_000, _synthetic, SHIFTED, _synthetic_sd),
        Scenario("training", 10_000, 10_000, _synthetic, SHIFTED, _synthetic_sd),
    )
}


def windows(scenario: Scenario, seed: int, shift: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One run's reference and current window; 3 numeric columns of the current moved by ``shift`` sd."""
    rng = np.random.default_rng(seed)
    reference = scenario.draw(rng, scenario.reference_rows)
    current = scenario.draw(rng, scenario.current_rows)
    if shift:
        for column, sd in scenario.sd().items():
            current[column] = current[column] + shift * sd
    return reference, current


def _alarm(result: Any, rule: str) -> bool:
    """``verdict``: the run's drift verdict (what the flow fails on); ``any-column``: any column drifted."""
    return bool(result.drifted_columns()) if rule == "any-column" else bool(result.dataset_drift)


def run_scenario(
    scenario: Scenario,
    runs: int,
    shift_runs: int,
    config: Any,
    engine: str,
    rule: str,
    shift: float = SHIFT_SD,
    first_seed: int = 0,
) -> dict[str, Any]:
    """``runs`` clean runs and ``shift_runs`` shifted ones, each on its own seed; the rates and their intervals."""
    from monitoring.drift import compute_drift

    def judge(reference: pd.DataFrame, current: pd.DataFrame) -> Any:
        return compute_drift(reference, current, list(reference.columns), config, report=engine == "report")

    started = time.perf_counter()
    alarms, alarmed_columns = 0, 0
    for seed in range(first_seed, first_seed + runs):
        result = judge(*windows(scenario, seed))
        alarmed = _alarm(result, rule)
        alarms += alarmed
        alarmed_columns += len(result.drifted_columns()) if alarmed else 0
        if (seed - first_seed + 1) % 250 == 0:
            log(f"{scenario.name}: {seed - first_seed + 1}/{runs} clean runs, {alarms} alarms")
    caught, exact = 0, 0
    for seed in range(first_seed + 1_000_000, first_seed + 1_000_000 + shift_runs):
        result = judge(*windows(scenario, seed, shift))
        if _alarm(result, rule):
            caught += 1
            exact += set(result.drifted_columns()) <= set(scenario.shifted)
    clean_ci = stats.binomtest(alarms, runs).proportion_ci(method="exact") if runs else None
    shift_ci = stats.binomtest(caught, shift_runs).proportion_ci(method="exact") if shift_runs else None
    return {
        "scenario": scenario.name,
        "reference_rows": scenario.reference_rows,
        "current_rows": scenario.current_rows,
        "columns": len(scenario.draw(np.random.default_rng(0), 5).columns),
        "runs": runs,
        "false_alarms": alarms,
        "false_alarm_rate": alarms / runs if runs else None,
        "false_alarm_ci95": [clean_ci.low, clean_ci.high] if clean_ci else None,
        "columns_per_false_alarm": alarmed_columns / alarms if alarms else None,
        "shift_runs": shift_runs,
        "detected": caught,
        "detection_rate": caught / shift_runs if shift_runs else None,
        "detection_ci95": [shift_ci.low, shift_ci.high] if shift_ci else None,
        "detections_naming_only_shifted": exact,
        "seconds": round(time.perf_counter() - started, 1),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.2f} %"


def table(report: dict[str, Any]) -> str:
    lines = [
        f"drift verdict on clean traffic and with 3 columns shifted by {report['shift_sd']} sd "
        f"({report['engine']} engine, alarm: {report['alarm']}; settings {report['settings']})",
        f"{'scenario':<10} {'ref':>6} {'cur':>6} {'cols':>4} {'runs':>5} {'false alarms':>13} {'95 % CI':>19} "
        f"{'shift runs':>10} {'detected':>9} {'95 % CI':>19} {'only shifted named':>18}",
    ]
    for r in report["scenarios"] + [report["pooled"]]:
        ci = r["false_alarm_ci95"]
        dci = r["detection_ci95"]
        caught = (_pct(dci[0]) + "-" + _pct(dci[1])) if dci else "-"
        lines.append(
            f"{r['scenario']:<10} {r['reference_rows']:>6} {r['current_rows']:>6} {r['columns']:>4} {r['runs']:>5} "
            f"{_pct(r['false_alarm_rate']):>13} {(_pct(ci[0]) + '-' + _pct(ci[1])) if ci else '-':>19} "
            f"{r['shift_runs']:>10} {_pct(r['detection_rate']):>9} {caught:>19} "
            f"{r['detections_naming_only_shifted']:>18}"
        )
    lines.append(
        f"{report['date']}, commit {report['commit']}, {report['seconds']} s, load average "
        f"{' '.join(f'{x:.2f}' for x in report['loadavg_before'])} before, "
        f"{' '.join(f'{x:.2f}' for x in report['loadavg_after'])} after, {os.cpu_count()} cores"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.drift_false_alarms",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--runs", type=int, default=1000, help="clean runs per scenario")
    parser.add_argument(
        "--shift-runs", type=int, default=200, help="runs with 3 columns shifted by 0.5 sd, per scenario"
    )
    parser.add_argument(
        "--shift-sd", type=float, default=SHIFT_SD, help="how far the 3 columns move, in standard deviations"
    )
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="repeat it; default: all")
    parser.add_argument(
        "--drift",
        type=json.loads,
        default=None,
        help="drift settings, JSON, as an endpoint's monitoring.drift (default: the defaults)",
    )
    parser.add_argument("--engine", choices=("fast", "report"), default="fast")
    parser.add_argument(
        "--alarm",
        choices=("verdict", "any-column"),
        default="verdict",
        help="verdict: the run's drift verdict; any-column: any drifted column alarms, whatever the "
        "settings' drift_share (the rule the verdict is compared with)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.shift_runs < 0:
        parser.error("--runs must be at least 1 and --shift-runs at least 0")
    from serving.endpoints.monitoring_settings import DriftConfig, overridden

    config = overridden(DriftConfig, args.drift, "drift setting")
    run = Provenance("benchmarks.drift_false_alarms", argv, VERDICT_CODE)
    results = [
        run_scenario(SCENARIOS[name], args.runs, args.shift_runs, config, args.engine, args.alarm, args.shift_sd)
        for name in (args.scenario or list(SCENARIOS))
    ]
    pooled_runs, pooled_alarms = sum(r["runs"] for r in results), sum(r["false_alarms"] for r in results)
    pooled_ci = stats.binomtest(pooled_alarms, pooled_runs).proportion_ci(method="exact")
    pooled = {
        "scenario": "pooled",
        "reference_rows": "",
        "current_rows": "",
        "columns": "",
        "runs": pooled_runs,
        "false_alarms": pooled_alarms,
        "false_alarm_rate": pooled_alarms / pooled_runs,
        "false_alarm_ci95": [pooled_ci.low, pooled_ci.high],
        "shift_runs": "",
        "detection_rate": None,
        "detection_ci95": None,
        "detections_naming_only_shifted": "",
    }
    report = {
        **run.record(),
        "shift_sd": args.shift_sd,
        "engine": args.engine,
        "alarm": args.alarm,
        "settings": config.__dict__,
        "scenarios": results,
        "pooled": pooled,
    }
    print(json.dumps(report, indent=1, default=str) if args.json else table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
