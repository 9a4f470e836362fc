"""Parity of served features: recompute logged requests' features offline at their logged time.

Reads the inference log's inputs and served features, asks Feast's ``get_historical_features`` through
the same FeatureService at each request's timestamp, and compares with ``monitoring.parity``.
"""

from __future__ import annotations

import json

import pandas as pd
from feast import FeatureStore

from feature_repo import store as feature_store
from flows import training
from monitoring.parity import ParityResult, compare_features
from serving.protocol.errors import ApiError
from serving.protocol.scoring import parse_scoring_request

ROW_KEY = "__logged_row"


def request_frame(inputs: str) -> pd.DataFrame | None:
    """The rows of a logged request body (any scoring format); None if it does not parse."""
    for content_type in ("application/json", "text/csv"):
        try:
            return parse_scoring_request(inputs.encode(), content_type, max_rows=1_000_000).frame
        except ApiError:
            continue
    return None


def logged_rows(log: pd.DataFrame, sample: int | None = None, seed: int = 0) -> pd.DataFrame:
    """One row per served row of successful requests: request columns, timestamp, served features."""
    ok = log[(log["status_code"] == 200) & log["served_features"].notna() & log["inputs"].notna()]
    rows: list[pd.DataFrame] = []
    for request_id, ts, inputs, served in zip(ok["request_id"], ok["timestamp"], ok["inputs"], ok["served_features"]):
        request = request_frame(inputs)
        features = pd.DataFrame(json.loads(served))
        if request is None or len(request) != len(features):
            continue
        frame = pd.concat([request.reset_index(drop=True), features.add_prefix("served__")], axis=1)
        frame["request_id"] = request_id
        frame["event_timestamp"] = ts
        rows.append(frame)
    if not rows:
        return pd.DataFrame()
    out = pd.concat(rows, ignore_index=True)
    if sample is not None and len(out) > sample:
        out = out.sample(sample, random_state=seed).reset_index(drop=True)
    return out


def parity_of(store: FeatureStore, service_name: str, rows: pd.DataFrame, rel_tol: float = 1e-6) -> ParityResult:
    """Compare each logged row's served features with Feast's offline features at its logged time."""
    names = feature_store.feature_names(feature_store.feature_service(store, service_name))
    entities = rows.drop(columns=[c for c in rows.columns if c.startswith("served__")] + ["request_id"])
    entities[ROW_KEY] = range(len(entities))
    entities["event_timestamp"] = pd.to_datetime(entities["event_timestamp"], utc=True).dt.floor("us")
    offline = training.historical_features(store, service_name, entities, key=ROW_KEY)
    served = rows[[f"served__{n}" for n in names]].rename(columns=lambda c: c.removeprefix("served__"))
    return compare_features(served.reset_index(drop=True), offline[names].reset_index(drop=True), names, rel_tol)
