"""Windowed aggregates computed point-in-time from raw transactions.

This is the only place these features are computed. The materialize flow writes the tables; Feast
serves them to training (``get_historical_features``) and to serving (the online store) alike.

Time semantics, so that training rows never see the future:
- a transaction's own activity becomes visible ``INGEST_DELAY`` after it happens, so a transaction
  scored at its own timestamp sees only what happened before it, exactly as a live request does;
- every customer and merchant also gets a snapshot at each midnight, so windows decay on quiet days;
- a merchant's fraud rate counts only labels already known at the snapshot time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pandas as pd

INGEST_DELAY = pd.Timedelta(seconds=1)
CUSTOMER_WINDOWS: dict[str, str] = {"1h": "1h", "24h": "24h", "7d": "7D"}
MERCHANT_WINDOW = pd.Timedelta(days=30)
# Beta prior for a merchant's fraud rate: a merchant with no known labels gets PRIOR_RATE.
PRIOR_RATE = 0.01
PRIOR_WEIGHT = 20.0

TRANSACTION_COLUMNS = ("customer_id", "merchant_id", "event_timestamp", "amount", "is_fraud", "label_available_ts")


def require_columns(frame: pd.DataFrame, columns: tuple[str, ...], what: str) -> None:
    """Fail with the missing column names before any work is done."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{what} is missing column(s): {', '.join(missing)}")


def midnights(start: datetime, end: datetime) -> pd.DatetimeIndex:
    """Every UTC midnight in [floor(start), end]."""
    first = pd.Timestamp(start).tz_convert("UTC").floor("D")
    return pd.date_range(first, pd.Timestamp(end).tz_convert("UTC"), freq="D")


def customer_activity_table(
    transactions: pd.DataFrame, customer_ids: pd.Series, start: datetime, end: datetime
) -> pd.DataFrame:
    """Spend and count per customer over 1 h / 24 h / 7 d, one row per transaction and per midnight."""
    require_columns(transactions, TRANSACTION_COLUMNS, "transactions")
    tx = transactions.loc[:, ["customer_id", "event_timestamp", "amount"]].copy()
    tx["is_txn"] = 1
    days = midnights(start, end)
    ids = np.asarray(customer_ids, dtype="int64")
    ticks = pd.DataFrame(
        {
            "customer_id": np.repeat(ids, len(days)),
            "event_timestamp": pd.DatetimeIndex(np.tile(days.values, len(ids))).tz_localize("UTC"),
            "amount": 0.0,
            "is_txn": 0,
        }
    )
    rows = pd.concat([ticks, tx], ignore_index=True)
    rows = rows.sort_values(["customer_id", "event_timestamp", "is_txn"], kind="stable").reset_index(drop=True)
    out = pd.DataFrame({"customer_id": rows["customer_id"].to_numpy()})
    grouped = rows.set_index("event_timestamp").groupby("customer_id", sort=False)
    for label, window in CUSTOMER_WINDOWS.items():
        sums = grouped[["amount", "is_txn"]].rolling(window).sum().reset_index(drop=True)
        out[f"cust_spend_{label}"] = sums["amount"].round(6).to_numpy()
        out[f"cust_txn_count_{label}"] = sums["is_txn"].round().astype("int64").to_numpy()
    count7 = out["cust_txn_count_7d"].to_numpy()
    out["cust_mean_amount_7d"] = np.where(count7 > 0, out["cust_spend_7d"] / np.maximum(count7, 1), 0.0).round(6)
    delay = pd.to_timedelta(rows["is_txn"].to_numpy() * INGEST_DELAY.value, unit="ns")
    out["feature_ts"] = (rows["event_timestamp"] + delay).to_numpy()
    out["feature_ts"] = pd.to_datetime(out["feature_ts"], utc=True)
    # Two rows visible at the same instant: the later one (more events counted) wins.
    out = out.drop_duplicates(["customer_id", "feature_ts"], keep="last")
    return out.sort_values(["feature_ts", "customer_id"], kind="stable").reset_index(drop=True)


def merchant_risk_table(
    transactions: pd.DataFrame, merchant_ids: pd.Series, start: datetime, end: datetime
) -> pd.DataFrame:
    """Daily snapshot per merchant: fraud rate over the last 30 d of labels known at that midnight."""
    require_columns(transactions, TRANSACTION_COLUMNS, "transactions")
    ids = pd.Index(np.asarray(merchant_ids, dtype="int64"), name="merchant_id")
    ts = transactions["event_timestamp"]
    known_at = transactions["label_available_ts"]
    frames = []
    for day in midnights(start, end):
        in_window = (ts >= day - MERCHANT_WINDOW) & (ts < day)
        window = transactions.loc[in_window, ["merchant_id", "is_fraud"]]
        known = window[(known_at[in_window] <= day).to_numpy()]
        txn_count = window.groupby("merchant_id").size().reindex(ids, fill_value=0)
        known_count = known.groupby("merchant_id").size().reindex(ids, fill_value=0)
        frauds = known.groupby("merchant_id")["is_fraud"].sum().reindex(ids, fill_value=0)
        rate = (frauds + PRIOR_RATE * PRIOR_WEIGHT) / (known_count + PRIOR_WEIGHT)
        frames.append(
            pd.DataFrame(
                {
                    "merchant_id": ids.to_numpy(),
                    "feature_ts": day,
                    "merch_fraud_rate_30d": rate.round(8).to_numpy(),
                    "merch_txn_count_30d": txn_count.astype("int64").to_numpy(),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def feature_tables(
    transactions: pd.DataFrame, customer_ids: pd.Series, merchant_ids: pd.Series, end: datetime | None = None
) -> dict[str, pd.DataFrame]:
    """Both tables, covering the transactions' span up to ``end`` (default: the last transaction)."""
    require_columns(transactions, TRANSACTION_COLUMNS, "transactions")
    if transactions.empty:
        raise ValueError("transactions is empty: nothing to compute features from")
    start = transactions["event_timestamp"].min().to_pydatetime()
    last = transactions["event_timestamp"].max().to_pydatetime()
    end = end or last + timedelta(seconds=1)
    return {
        "customer_activity": customer_activity_table(transactions, customer_ids, start, end),
        "merchant_risk": merchant_risk_table(transactions, merchant_ids, start, end),
    }
