"""Drift without false alarms on clean resamples, a shifted feature named; labels joined by request id."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from flows.served_data import prediction_score
from flows.skew import drift_config
from monitoring.drift import compute_drift
from monitoring.labels import join_labels, predicted_class
from serving.endpoints.monitoring_settings import DriftConfig


def _population(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "amount": rng.lognormal(3.5, 1.0, n),
            "count_24h": rng.poisson(3, n),
            "risk": rng.beta(2, 60, n),
            "ratio": rng.gamma(2.0, 0.5, n),
            "channel": rng.choice(["web", "pos", "app"], n, p=[0.5, 0.3, 0.2]),
        }
    )


COLUMNS = ["amount", "count_24h", "risk", "ratio", "channel"]


def test_twenty_clean_resamples_raise_no_drift_and_a_shifted_feature_is_named():
    reference = _population(5000, seed=0)
    population = _population(200_000, seed=1)
    for run in range(20):
        current = population.sample(500, random_state=run)
        result = compute_drift(reference, current, COLUMNS)
        assert result.drifted_columns() == [] and not result.dataset_drift, (run, result.table())
    shifted = population.sample(500, random_state=99)
    shifted["ratio"] = shifted["ratio"] * 1.8 + 0.3
    result = compute_drift(reference, shifted, COLUMNS)
    assert result.drifted_columns() == ["ratio"]
    assert {c.column: c.method for c in result.columns} == {
        "amount": "ks",
        "count_24h": "ks",
        "risk": "ks",
        "ratio": "ks",
        "channel": "chi2_contingency",
    }


def test_a_shifted_category_is_named_by_the_chi_square_test_of_homogeneity():
    reference = _population(5000, seed=0)
    current = _population(500, seed=2)
    current["channel"] = np.random.default_rng(3).choice(["web", "pos", "app"], 500, p=[0.1, 0.2, 0.7])
    assert compute_drift(reference, current, COLUMNS).drifted_columns() == ["channel"]


def test_drift_settings_override_defaults_and_refuse_unknown_keys():
    assert drift_config({"numeric_threshold": 0.001}) == DriftConfig(numeric_threshold=0.001)
    assert drift_config({"numeric_method": "psi", "numeric_threshold": 0.3}).numeric_threshold == 0.3
    with pytest.raises(ValueError, match="numeric_treshold"):
        drift_config({"numeric_treshold": 0.3})
    with pytest.raises(ValueError, match="correction must be one of holm, bonferroni, none"):
        drift_config({"correction": "fdr"})


def test_prediction_scores():
    assert prediction_score([0.9, 0.1]) == 0.1
    assert prediction_score([0.1, 0.2, 0.7]) == 2.0
    assert prediction_score(3.5) == 3.5 and prediction_score([4.0]) == 4.0 and prediction_score("x") is None


def test_predicted_classes():
    assert predicted_class([0.9, 0.1]) == "0" and predicted_class([0.2, 0.8]) == "1"
    assert predicted_class(0.7) == "1" and predicted_class(1) == "1" and predicted_class(True) == "1"
    assert predicted_class("cat") == "cat" and predicted_class(None) is None and predicted_class(2.0) == "2"


def _record(request_id: str, outputs: list, status: int = 200, entity: str = "m-1") -> dict:
    return {
        "request_id": request_id,
        "timestamp": datetime(2026, 11, 29, tzinfo=UTC),
        "endpoint": "e",
        "served_entity": entity,
        "model_version": "1",
        "status_code": status,
        "outputs": json.dumps(outputs) if status == 200 else None,
    }


def test_labels_join_by_request_id_and_row_and_count_the_unmatched():
    log = pd.DataFrame(
        [_record("a", [[0.9, 0.1]]), _record("b", [[0.2, 0.8], [0.7, 0.3]], entity="m-2"), _record("c", [], status=500)]
    )
    labels = pd.DataFrame(
        {"request_id": ["a", "b", "b", "c", "zzz", "a"], "row": [0, 0, 1, 0, 0, 0], "label": [1, 1, 1, 0, 0, 0]}
    )
    joined = join_labels(log, labels)
    table = joined.labelled.set_index(["request_id", "row"])
    assert list(table.index) == [("a", 0), ("b", 0), ("b", 1)]
    assert table.loc[("a", 0), "label"] == "0" and table.loc[("a", 0), "correct"]  # the later label of a row wins
    assert table.loc[("b", 0), "correct"] and not table.loc[("b", 1), "correct"]
    assert joined.unmatched == 2  # the failed request and the unknown id
    assert {r["served_entity"]: r["accuracy"] for r in joined.accuracy_by_entity()} == {"m-1": 1.0, "m-2": 0.5}
    with pytest.raises(ValueError, match="label"):
        join_labels(log, pd.DataFrame({"request_id": ["a"]}))
