"""From drawn values to columns: UTC timestamps at millisecond resolution, labels from indices."""

from __future__ import annotations

import numpy as np
import pandas as pd

from feature_repo.synthetic.config import SyntheticConfig

SECONDS_PER_DAY = 86_400
NS_PER_MS = 1_000_000
MS_PER_SECOND = 1_000


def start_ns(config: SyntheticConfig) -> int:
    return int(pd.Timestamp(config.start).tz_convert("UTC").value)


def to_utc(ns: np.ndarray) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(ns.astype("datetime64[ns]")).tz_localize("UTC")


def seconds_to_ns(seconds: np.ndarray) -> np.ndarray:
    """Floor to millisecond resolution, return int64 nanoseconds."""
    return np.floor(seconds * MS_PER_SECOND).astype(np.int64) * NS_PER_MS


def labels(values: tuple[str, ...], index: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=object)[index]
