"""What drift compares a version's served rows with when its run holds no training frame: a window of the
version's own served traffic. Pure: served rows (one per row of a request, with ``request_id`` and
``timestamp``) and the window's settings in, the reference rows and how they were chosen out."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd


@dataclass(frozen=True)
class ServedReference:
    rows: pd.DataFrame
    requests: int
    start: pd.Timestamp | None
    end: pd.Timestamp | None  # the rows compared with it are served from here on (never the reference's own)
    complete: bool  # False while the window is still filling: no verdict yet
    described: str


def _times(rows: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(rows.groupby("request_id")["timestamp"].min(), utc=True).sort_values(kind="stable")


def first_served_window(rows: pd.DataFrame, first_requests: int, first_hours: float, now: datetime) -> ServedReference:
    """The rows of the version's first ``first_requests`` requests that came within ``first_hours`` of its
    first one. Complete once it holds ``first_requests`` requests or ``first_hours`` have passed."""
    times = _times(rows) if not rows.empty else pd.Series(dtype="datetime64[ns, UTC]")
    if times.empty:
        return ServedReference(rows.iloc[:0], 0, None, None, False, "first served window: no request served yet")
    start = times.iloc[0]
    closes = start + pd.Timedelta(hours=first_hours)
    chosen = times[times < closes].iloc[:first_requests]
    complete = len(chosen) >= first_requests or pd.Timestamp(now) >= closes
    described = (
        f"first served window: {len(chosen)} requests from {start.isoformat()} to {chosen.iloc[-1].isoformat()}"
        + ("" if complete else f" (filling until {first_requests} requests or {closes.isoformat()})")
    )
    return ServedReference(
        rows[rows["request_id"].isin(chosen.index)], len(chosen), start, chosen.iloc[-1], complete, described
    )


def pinned_window(rows: pd.DataFrame, start: datetime, end: datetime) -> ServedReference:
    """The rows of the requests served in [start, end), as the endpoint's ``monitoring.reference`` pins."""
    times = _times(rows) if not rows.empty else pd.Series(dtype="datetime64[ns, UTC]")
    chosen = times[(times >= pd.Timestamp(start)) & (times < pd.Timestamp(end))]
    return ServedReference(
        rows[rows["request_id"].isin(chosen.index)],
        len(chosen),
        pd.Timestamp(start),
        pd.Timestamp(end),
        True,
        f"pinned window of served traffic: {len(chosen)} requests from {pd.Timestamp(start).isoformat()} "
        f"to {pd.Timestamp(end).isoformat()}",
    )


def after(rows: pd.DataFrame, reference: ServedReference) -> pd.DataFrame:
    """The rows served after the reference window: what is compared with it (never the reference itself)."""
    if reference.end is None or rows.empty:
        return rows
    stamps = pd.to_datetime(rows["timestamp"], utc=True)
    return rows[(stamps >= reference.end) & ~rows["request_id"].isin(reference.rows["request_id"])]
