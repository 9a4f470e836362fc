"""Delayed ground truth joined to logged requests by request id: pure frames in, labelled rows out.

A label names a request id, the row within the request (0 by default) and the true value. Each
logged prediction becomes a class: a probability vector its argmax, a number its value rounded at
``threshold`` when it lies in [0, 1], anything else its text. ``correct`` compares class and label as
text, so 1, 1.0, "1" and True agree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

LABELLED_COLUMNS = (
    "request_id",
    "row",
    "timestamp",
    "endpoint",
    "served_entity",
    "model_version",
    "predicted",
    "label",
    "correct",
)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def predicted_class(value: Any, threshold: float = 0.5) -> str | None:
    """The class a logged prediction stands for; None if it is missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, dict):
        value = next(iter(value.values()), None)
        return predicted_class(value, threshold)
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value) and len(value) > 1:
            return str(max(range(len(value)), key=lambda i: value[i]))
        return predicted_class(value[0], threshold)
    if isinstance(value, float) and 0.0 <= value <= 1.0 and not value.is_integer():
        return "1" if value >= threshold else "0"
    return _text(value)


def label_frame(labels: pd.DataFrame) -> pd.DataFrame:
    """Labels with ``request_id``, ``row`` (default 0) and ``label``; the last label of a row wins."""
    missing = [c for c in ("request_id", "label") if c not in labels.columns]
    if missing:
        raise ValueError(f"labels need column(s) {', '.join(missing)}; got {', '.join(map(str, labels.columns))}")
    out = labels.copy()
    if "row" not in out.columns:
        out["row"] = 0
    out["request_id"] = out["request_id"].astype(str)
    out["row"] = out["row"].astype(int)
    return out.drop_duplicates(["request_id", "row"], keep="last")[["request_id", "row", "label"]]


@dataclass(frozen=True)
class LabelJoin:
    labelled: pd.DataFrame  # LABELLED_COLUMNS
    unmatched: int  # labels whose request id (or row) is not in the log

    def accuracy_by_entity(self) -> list[dict[str, Any]]:
        if self.labelled.empty:
            return []
        grouped = self.labelled.groupby(["served_entity", "model_version"], dropna=False)["correct"]
        return [
            {"served_entity": e, "model_version": v, "rows": int(s.size), "accuracy": round(float(s.mean()), 6)}
            for (e, v), s in grouped
        ]


def join_labels(log: pd.DataFrame, labels: pd.DataFrame, threshold: float = 0.5) -> LabelJoin:
    """Each label matched to its logged prediction (successful requests only) by request id and row."""
    wanted = label_frame(labels)
    ok = log[log["status_code"] == 200] if not log.empty else log
    rows: list[dict[str, Any]] = []
    for rec in ok[ok["request_id"].isin(set(wanted["request_id"]))].itertuples(index=False):
        outputs = json.loads(rec.outputs) if rec.outputs else []
        for index, value in enumerate(outputs if isinstance(outputs, list) else [outputs]):
            rows.append(
                {
                    "request_id": rec.request_id,
                    "row": index,
                    "timestamp": rec.timestamp,
                    "endpoint": rec.endpoint,
                    "served_entity": rec.served_entity,
                    "model_version": rec.model_version,
                    "predicted": predicted_class(value, threshold),
                }
            )
    served = pd.DataFrame(
        rows, columns=["request_id", "row", "timestamp", "endpoint", "served_entity", "model_version", "predicted"]
    )
    joined = served.merge(wanted, on=["request_id", "row"], how="inner")
    joined["label"] = joined["label"].map(_text)
    joined["correct"] = joined["predicted"].astype(str) == joined["label"]
    return LabelJoin(joined[list(LABELLED_COLUMNS)].reset_index(drop=True), len(wanted) - len(joined))
