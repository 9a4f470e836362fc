"""What a data set is made of: the public vocabularies of its columns, its size and seed
(:class:`SyntheticConfig`) and the generated tables (:class:`SyntheticData`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

AGE_GROUPS: tuple[str, ...] = ("18-25", "26-40", "41-60", "61+")
REGIONS: tuple[str, ...] = ("north", "south", "east", "west", "central")
CATEGORIES: tuple[str, ...] = (
    "grocery",
    "restaurants",
    "fuel",
    "pharmacy",
    "apparel",
    "online_retail",
    "electronics",
    "travel",
    "gaming",
)
CHANNELS: tuple[str, ...] = ("in_store", "online")


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and seed of a synthetic data set."""

    n_customers: int = 1000
    n_merchants: int = 200
    days: int = 42
    start: datetime = datetime(2026, 9, 1, tzinfo=UTC)
    seed: int = 7
    mean_txns_per_customer_day: float = 2.0

    def __post_init__(self) -> None:
        for name in ("n_customers", "n_merchants", "days"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value <= 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        rate = self.mean_txns_per_customer_day
        if not isinstance(rate, (int, float, np.number)) or not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"mean_txns_per_customer_day must be > 0, got {rate!r}")
        if not isinstance(self.start, datetime) or self.start.utcoffset() is None:
            raise ValueError(f"start must be a timezone-aware datetime, got {self.start!r}")


@dataclass(frozen=True)
class SyntheticData:
    """The three generated tables."""

    customers: pd.DataFrame
    merchants: pd.DataFrame
    transactions: pd.DataFrame
