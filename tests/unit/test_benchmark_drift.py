"""``benchmarks.drift_false_alarms`` runs end to end: clean windows come from one distribution, the shifted
columns move by the asked amount, and the table holds the rates with their intervals and the run's record."""

from __future__ import annotations

import json

import pytest

from benchmarks import drift_false_alarms as bench


def test_clean_windows_share_a_distribution_and_a_shift_moves_only_the_named_columns():
    scenario = bench.SCENARIOS["small"]
    reference, clean = bench.windows(scenario, seed=1)
    _, shifted = bench.windows(scenario, seed=1, shift=0.5)
    assert len(reference) == 1000 and len(clean) == 200 and list(reference.columns) == list(clean.columns)
    moved = [c for c in clean.columns if not clean[c].equals(shifted[c])]
    assert moved == list(scenario.shifted)
    for column, sd in scenario.sd().items():
        assert (shifted[column] - clean[column]).mean() == pytest.approx(0.5 * sd)


def test_the_benchmark_prints_rates_and_the_run_record(capsys):
    assert bench.main(["--runs", "4", "--shift-runs", "2", "--scenario", "reported", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (row,) = report["scenarios"]
    assert row["scenario"] == "reported" and row["columns"] == 31 and row["runs"] == 4 and row["shift_runs"] == 2
    assert 0 <= row["false_alarm_ci95"][0] <= row["false_alarm_ci95"][1] <= 1
    assert report["command"].startswith("python -m benchmarks.drift_false_alarms --runs 4")
    assert report["commit"] and report["date"] and len(report["loadavg_before"]) == 3
    assert report["settings"]["numeric_method"] == "ks"


def test_a_run_count_below_one_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--runs", "0"])
    assert "--runs must be at least 1" in capsys.readouterr().err
