"""Frames out of inference-log records: one row per served row, not per request."""

from __future__ import annotations

import json

import pandas as pd


def served_feature_rows(log: pd.DataFrame, ok_only: bool = True) -> pd.DataFrame:
    """The feature vectors the model was fed, one row per served row, with the request id and time."""
    if log.empty or "served_features" not in log.columns:
        return pd.DataFrame()
    records = log[log["status_code"] == 200] if ok_only else log
    rows: list[dict] = []
    for request_id, ts, features in zip(records["request_id"], records["timestamp"], records["served_features"]):
        if not features:
            continue
        for index, row in enumerate(json.loads(features)):
            rows.append({"request_id": request_id, "timestamp": ts, "row": index, **row})
    return pd.DataFrame(rows)
