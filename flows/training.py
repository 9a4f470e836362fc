"""Training logic the train flow orchestrates: time split, training set, fit, evaluate, log.

Features come only from the model's Feast FeatureService (``get_historical_features``, point in time;
its on-demand views run on their own inputs, as in batch scoring: ``feature_repo.retrieval``), so
training reads exactly the definitions serving reads.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from feast import FeatureStore

from feature_repo import retrieval
from feature_repo import store as feature_store

log = logging.getLogger(__name__)

LABEL = "is_fraud"
ROW_KEY = "transaction_id"
SENSITIVE_ATTRIBUTE = "age_group"
REQUEST_COLUMNS = ("customer_id", "merchant_id", "event_timestamp", "amount")


@dataclass(frozen=True)
class TimeSplit:
    """Train on [train_start, eval_start), evaluate on the later slice [eval_start, eval_end).

    Only labels known at ``as_of`` are used, so the split is what a nightly job could see that night.
    """

    train_start: datetime
    eval_start: datetime
    eval_end: datetime
    as_of: datetime

    def __post_init__(self) -> None:
        if not self.train_start < self.eval_start < self.eval_end <= self.as_of:
            raise ValueError("time split must satisfy train_start < eval_start < eval_end <= as_of")

    @classmethod
    def for_span(
        cls,
        first: datetime,
        as_of: datetime,
        warmup: timedelta = timedelta(days=7),
        eval_length: timedelta = timedelta(days=7),
        label_horizon: timedelta = timedelta(days=14),
    ) -> TimeSplit:
        """Skip a warm-up (windows fill), keep the last ``label_horizon`` out (labels still pending)."""
        eval_end = as_of - label_horizon
        return cls(first + warmup, eval_end - eval_length, eval_end, as_of)


def split_rows(transactions: pd.DataFrame, split: TimeSplit) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Labelled rows of each slice, keeping only labels known at ``split.as_of``."""
    ts = transactions["event_timestamp"]
    known = transactions["label_available_ts"] <= pd.Timestamp(split.as_of)
    train = transactions[(ts >= pd.Timestamp(split.train_start)) & (ts < pd.Timestamp(split.eval_start)) & known]
    evaluation = transactions[(ts >= pd.Timestamp(split.eval_start)) & (ts < pd.Timestamp(split.eval_end)) & known]
    if train.empty or evaluation.empty:
        raise ValueError(
            f"time split leaves {len(train)} training and {len(evaluation)} evaluation rows: "
            "the data span is too short for the warm-up, evaluation and label horizon"
        )
    return train.reset_index(drop=True), evaluation.reset_index(drop=True)


def entity_frame(rows: pd.DataFrame) -> pd.DataFrame:
    """What a live request carries: entity keys, the request-time fields and the row key."""
    frame = rows.loc[:, [ROW_KEY, *REQUEST_COLUMNS]].copy()
    frame["event_timestamp"] = pd.to_datetime(frame["event_timestamp"], utc=True).dt.floor("us")
    return frame


def check_entity_frame(store: FeatureStore, service_name: str, entities: pd.DataFrame, key: str) -> None:
    """Join keys, request fields, the timestamp and the row key present and typed; errors name the column."""
    service = feature_store.feature_service(store, service_name)
    fields = feature_store.request_fields(store, service)
    required = [key, *feature_store.entity_join_keys(store, service), *fields, "event_timestamp"]
    missing = [c for c in required if c not in entities.columns]
    if missing:
        raise ValueError(f"entity rows for {service_name} are missing column(s): {', '.join(missing)}")
    for column in [*feature_store.entity_join_keys(store, service), *fields]:
        if not pd.api.types.is_numeric_dtype(entities[column]) or pd.api.types.is_bool_dtype(entities[column]):
            raise ValueError(f"entity rows column {column} must be numeric, got {entities[column].dtype}")
    if entities[key].duplicated().any():
        raise ValueError(f"entity rows column {key} must be unique: it keys the result rows")


def historical_features(
    store: FeatureStore, service_name: str, entities: pd.DataFrame, key: str = ROW_KEY
) -> pd.DataFrame:
    """Point-in-time features for every entity row, in the input's order; no row may be dropped."""
    check_entity_frame(store, service_name, entities, key)
    service = feature_store.feature_service(store, service_name)
    frame = retrieval.historical_features(store, service, entities)
    if len(frame) != len(entities):
        raise RuntimeError(
            f"feature retrieval returned {len(frame)} rows for {len(entities)} entity rows: rows were dropped"
        )
    frame = frame.set_index(key).loc[entities[key]].reset_index()
    names = feature_store.feature_names(service)
    missing = [n for n in names if frame[n].isna().any()]
    if missing:
        raise RuntimeError(f"features with missing values after retrieval: {', '.join(missing)}")
    return frame


DEFAULT_HYPERPARAMETERS = {"n_estimators": 100, "max_depth": 3, "learning_rate": 0.1}


def fit(features: pd.DataFrame, labels: pd.Series, seed: int, **hyperparameters: Any) -> Any:
    """A gradient-boosted classifier (100 trees of depth 3 by default)."""
    from sklearn.ensemble import GradientBoostingClassifier

    model = GradientBoostingClassifier(**{**DEFAULT_HYPERPARAMETERS, **hyperparameters}, random_state=seed)
    return model.fit(features, labels)


def recall_at_precision(labels: np.ndarray, scores: np.ndarray, precision: float) -> float:
    """The best recall at any threshold whose precision is at least ``precision``."""
    from sklearn.metrics import precision_recall_curve

    p, r, _ = precision_recall_curve(labels, scores)
    ok = p >= precision
    return float(r[ok].max()) if ok.any() else 0.0


def evaluate(labels: pd.Series, scores: np.ndarray) -> dict[str, float]:
    """Ranking metrics on the later time slice."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    y = labels.to_numpy()
    return {
        "eval_pr_auc": float(average_precision_score(y, scores)),
        "eval_roc_auc": float(roc_auc_score(y, scores)),
        "eval_recall_at_p50": recall_at_precision(y, scores, 0.5),
        "eval_positive_rate": float(y.mean()),
        "eval_rows": float(len(y)),
    }


def git_commit(cwd: Path) -> str:
    """The code version, or 'unknown' outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"
