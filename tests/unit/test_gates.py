from __future__ import annotations

import numpy as np
import pandas as pd

from monitoring.fairness import group_rates
from serving.registry import gates

PROBE = gates.ProbeFigures(
    requests=100, errors=0, p50_ms=3.0, p99_ms=9.0, peak_rss_mb=400, cpu_ms_per_prediction=1.0, artifact_mb=0.5
)


def test_quality_against_minimums_and_the_champion():
    cfg = {"min": {"eval_pr_auc": 0.3}, "vs_champion": {"metric": "eval_pr_auc", "max_drop": 0.02}}
    assert gates.quality_gate(cfg, {"eval_pr_auc": 0.5}, {"eval_pr_auc": 0.51}).passed
    worse = gates.quality_gate(cfg, {"eval_pr_auc": 0.45}, {"eval_pr_auc": 0.5})
    assert (
        not worse.passed
        and "0.45" in worse.value
        and "0.5" in worse.value
        and "worse than the champion" in worse.reason
    )
    low = gates.quality_gate(cfg, {"eval_pr_auc": 0.2}, None)
    assert not low.passed and "below minimum" in low.reason
    assert not gates.quality_gate(cfg, {}, None).passed


def test_latency_and_cost_budgets():
    assert gates.latency_gate({"p50_ms": 5, "p99_ms": 10}, PROBE).passed
    slow = gates.latency_gate({"p50_ms": 2, "p99_ms": 10}, PROBE)
    assert not slow.passed and "p50 3.00ms > 2ms" in slow.reason
    erroring = gates.latency_gate({"p50_ms": 5, "p99_ms": 10}, gates.ProbeFigures(100, 3, 1, 2, 1, 1, 1))
    assert not erroring.passed and "3 of 100" in erroring.reason
    assert gates.cost_gate({"artifact_mb": 1, "peak_rss_mb": 500, "cpu_ms_per_prediction": 2}, PROBE).passed
    heavy = gates.cost_gate({"artifact_mb": 1, "peak_rss_mb": 300, "cpu_ms_per_prediction": 2}, PROBE)
    assert not heavy.passed and "peak_rss_mb" in heavy.reason


LATENCY = {"p50_ms": 5, "p99_ms": 10}
COST = {"artifact_mb": 1, "peak_rss_mb": 500, "cpu_ms_per_prediction": 2}
PAUSED = gates.ProbeFigures(
    requests=100, errors=0, p50_ms=3.0, p99_ms=437.0, peak_rss_mb=400, cpu_ms_per_prediction=1.0, artifact_mb=0.5
)


def probes(*figures: gates.ProbeFigures):
    """A measure() that answers the given probes in turn and counts its calls."""
    calls = []

    def measure() -> gates.ProbeFigures:
        calls.append(1)
        return figures[len(calls) - 1]

    return measure, calls


def test_a_probe_that_passes_is_measured_once():
    measure, calls = probes(PROBE, PAUSED)
    results = gates.serving_gates({"latency": LATENCY, "cost": COST, "quality": {}}, measure)
    assert set(results) == {"latency", "cost"} and all(r.passed for r in results.values()) and len(calls) == 1
    assert "earlier" not in results["latency"].value


def test_a_paused_probe_is_measured_again_and_the_pause_is_kept_in_the_value():
    measure, calls = probes(PAUSED, PROBE)
    results = gates.serving_gates({"latency": LATENCY, "cost": COST}, measure)
    assert len(calls) == 2 and results["latency"].passed and results["cost"].passed
    assert "probe 2 of 2" in results["latency"].value and "p99=437.00ms" in results["latency"].value


def test_a_slow_candidate_fails_every_probe_and_is_judged_on_the_last():
    slower = gates.ProbeFigures(100, 0, 3.0, 520.0, 400, 1.0, 0.5)
    measure, calls = probes(PAUSED, PAUSED, slower)
    results = gates.serving_gates({"latency": {**LATENCY, "probes": 3}, "cost": COST}, measure)
    assert len(calls) == 3 and not results["latency"].passed and results["cost"].passed
    assert "p99 520.00ms > 10ms" in results["latency"].reason and results["latency"].value.count("437.00") == 2
    measure, calls = probes(PAUSED, PROBE)
    assert not gates.serving_gates({"latency": {**LATENCY, "probes": 1}}, measure)["latency"].passed and len(calls) == 1
    assert gates.serving_gates({"quality": {}}, measure) == {} and len(calls) == 1


def test_fairness_gap_between_groups():
    rng = np.random.default_rng(0)
    groups = pd.Series(np.repeat(["a", "b"], 500))
    labels = pd.Series(np.zeros(1000, dtype=int))
    fair = rng.random(1000) * 0.4
    assert gates.fairness_gate({"attribute": "g", "max_gap": 0.05}, group_rates(labels, fair, groups)).passed
    unfair = np.where(groups == "a", 0.9, 0.1)
    result = gates.fairness_gate({"attribute": "g", "max_gap": 0.05}, group_rates(labels, unfair, groups))
    assert not result.passed and "gap=1.0000" in result.value and "between g b and a" in result.reason
    tiny = group_rates(labels.head(10), unfair[:10], groups.head(10), min_rows=30)
    assert not gates.fairness_gate({"attribute": "g", "max_gap": 0.05}, tiny).passed


def test_data_and_compatibility():
    assert gates.data_gate({"require_success": True}, {"gx.success": "true"}).passed
    assert not gates.data_gate({"require_success": True}, {"gx.success": "false", "gx.failed": "x"}).passed
    assert not gates.data_gate({"require_success": True}, {}).passed
    ok = gates.compatibility_gate(
        {}, input_names=["a", "b"], feature_service="s", expected_service="s", service_features=["a", "b"]
    )
    assert ok.passed
    assert not gates.compatibility_gate(
        {}, input_names=None, feature_service="s", expected_service="s", service_features=None
    ).passed
    assert not gates.compatibility_gate(
        {}, input_names=["a"], feature_service="t", expected_service="s", service_features=None
    ).passed
    off = gates.compatibility_gate(
        {}, input_names=["a", "z"], feature_service="s", expected_service="s", service_features=["a", "b"]
    )
    assert not off.passed and "extra ['z']" in off.reason
