"""Deterministic synthetic card-payment fraud data.

The generator is fully vectorised with numpy: every random quantity is drawn
as one array for all customers, merchants or transactions, so ten million
transactions take well under a minute.

Generative story (the latent parameters are *not* exported as columns):

* Customers have a habitual amount (lognormal, median ~40), a transaction
  rate around ``mean_txns_per_customer_day``, a few preferred merchants and a
  diurnal pattern (few transactions at night). The age group nudges habits
  slightly but never enters a fraud probability.
* Merchants have a latent risk; ~5 % are high-risk (gaming and online retail
  more often than groceries or fuel).
* Habitual transactions are rarely fraudulent, with a probability
  proportional to the merchant's latent risk (card-not-present a bit more).
* Legitimate shopping sprees (a few transactions within an hour or two at
  normal amounts) keep velocity from being a perfect fraud indicator.
* Card compromises hit ~8 % of customers once: a burst of 3-12 transactions
  within 1-3 hours, mostly online at high-risk merchants, 3-10x the
  customer's habitual amount, labelled fraud with probability ~0.9.

Fraud is therefore learnable from what a feature store can compute: spend
velocity per customer, a merchant's historical fraud rate and the amount
relative to the customer's own history.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

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

CUSTOMERS_FILE = "customers.parquet"
MERCHANTS_FILE = "merchants.parquet"
TRANSACTIONS_FILE = "transactions.parquet"

CUSTOMER_COLUMNS: tuple[str, ...] = ("customer_id", "age_group", "home_region", "signup_ts")
MERCHANT_COLUMNS: tuple[str, ...] = ("merchant_id", "category")
TRANSACTION_COLUMNS: tuple[str, ...] = (
    "transaction_id",
    "event_timestamp",
    "customer_id",
    "merchant_id",
    "amount",
    "channel",
    "is_fraud",
    "label_available_ts",
)

# --- hidden generative parameters -------------------------------------------

_AGE_PROBS = np.array([0.18, 0.34, 0.30, 0.18])
_AGE_AMOUNT_MULT = np.array([0.75, 1.00, 1.15, 1.00])
_AGE_RATE_MULT = np.array([1.10, 1.05, 0.95, 0.85])
_AGE_ONLINE_BIAS = np.array([0.10, 0.05, -0.03, -0.10])
_REGION_PROBS = np.array([0.24, 0.22, 0.20, 0.18, 0.16])

# Per category, in CATEGORIES order.
_CATEGORY_PROBS = np.array([0.20, 0.18, 0.12, 0.07, 0.08, 0.15, 0.08, 0.07, 0.05])
_CATEGORY_HIGH_RISK_PROB = np.array([0.02, 0.02, 0.02, 0.02, 0.02, 0.12, 0.08, 0.06, 0.25])
_CATEGORY_AMOUNT_MULT = np.array([1.0, 0.7, 1.2, 0.6, 1.3, 1.2, 2.0, 2.2, 0.6])
_CATEGORY_ONLINE_PROB = np.array([0.08, 0.10, 0.02, 0.15, 0.40, 0.95, 0.55, 0.70, 0.90])

_HABIT_MEDIAN = 40.0
_HABIT_SIGMA = 0.6
_AMOUNT_SIGMA = 0.5
_RATE_GAMMA_SHAPE = 3.0
_N_PREFERRED = 3
_PREFERRED_WEIGHTS = np.array([0.5, 0.3, 0.2])
_P_PREFERRED = 0.75

# Latent merchant risk is a relative score; habitual fraud probability is the
# score times a constant calibrated so that the traffic-weighted habitual fraud
# rate is _HABITUAL_FRAUD_RATE whatever merchants happen to be popular.
_LOW_RISK_RANGE = (0.2, 1.0)
_HIGH_RISK_RANGE = (8.0, 20.0)
_HABITUAL_FRAUD_RATE = 0.022
_MAX_HABITUAL_FRAUD_P = 0.4
_ONLINE_FRAUD_FACTOR = 1.5
_IN_STORE_FRAUD_FACTOR = 0.6

_SPREES_PER_CUSTOMER_DAY = 0.015
_SPREE_SIZE = (2, 6)
_SPREE_HOURS = (0.5, 2.0)
_SPREE_P_ONLINE = 0.2

_P_COMPROMISED = 0.08
_BURST_SIZE = (3, 12)
_BURST_HOURS = (1.0, 3.0)
_BURST_AMOUNT_MULT = (3.0, 10.0)
_BURST_P_HIGH_RISK = 0.8
_BURST_P_ONLINE = 0.85
_BURST_P_FRAUD = 0.9

_LABEL_DELAY_DAYS = (1.0, 14.0)
_LABEL_DELAY_GAMMA = (2.0, 1.5)  # shape, scale (days); same for both labels.
_SIGNUP_DAYS = (7.0, 5 * 365.0)

# Hour-of-day weights (UTC): quiet nights, lunch and evening peaks.
_HOUR_WEIGHTS = np.array(
    [0.20, 0.12, 0.08, 0.06, 0.08, 0.15, 0.35, 0.70, 1.00, 1.10, 1.20, 1.40,
     1.70, 1.60, 1.30, 1.20, 1.30, 1.60, 1.80, 1.70, 1.40, 1.10, 0.80, 0.45]
)
_WEEKEND_WEIGHT = 1.2

_SECONDS_PER_DAY = 86_400
_NS_PER_MS = 1_000_000
_MS_PER_SECOND = 1_000


@dataclass(frozen=True)
class SyntheticConfig:
    """Size and seed of a synthetic data set."""

    n_customers: int = 1000
    n_merchants: int = 200
    days: int = 42
    start: datetime = datetime(2026, 9, 1, tzinfo=timezone.utc)
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


@dataclass(frozen=True)
class _CustomerLatent:
    habit: np.ndarray
    rate: np.ndarray
    preferred: np.ndarray  # (n_customers, _N_PREFERRED) merchant indices
    hour_shift: np.ndarray
    online_bias: np.ndarray


@dataclass(frozen=True)
class _MerchantLatent:
    category_index: np.ndarray
    popularity: np.ndarray  # sums to 1
    risk: np.ndarray  # relative latent risk score
    high_risk: np.ndarray  # indices of high-risk merchants


@dataclass(frozen=True)
class _Block:
    """Transactions of one kind, unsorted; time as seconds since start."""

    offset_s: np.ndarray
    customer: np.ndarray
    merchant: np.ndarray
    amount: np.ndarray
    online: np.ndarray
    fraud: np.ndarray


# --- generation ----------------------------------------------------------------


def generate(config: SyntheticConfig) -> SyntheticData:
    """Generate customers, merchants and transactions; same seed, same frames."""
    rng = np.random.default_rng(config.seed)
    merchants, merch = _draw_merchants(rng, config)
    customers, cust = _draw_customers(rng, config, merch)
    fraud_p = _habitual_fraud_probability(cust, merch)
    blocks = [
        _habitual_transactions(rng, config, cust, merch, fraud_p),
        _spree_transactions(rng, config, cust, merch, fraud_p),
        _compromise_transactions(rng, config, cust, merch),
    ]
    transactions = _assemble(rng, config, blocks)
    return SyntheticData(customers=customers, merchants=merchants, transactions=transactions)


def _start_ns(config: SyntheticConfig) -> int:
    return int(pd.Timestamp(config.start).tz_convert("UTC").value)


def _to_utc(ns: np.ndarray) -> pd.DatetimeIndex:
    return pd.DatetimeIndex(ns.astype("datetime64[ns]")).tz_localize("UTC")


def _seconds_to_ns(seconds: np.ndarray) -> np.ndarray:
    """Floor to millisecond resolution, return int64 nanoseconds."""
    return np.floor(seconds * _MS_PER_SECOND).astype(np.int64) * _NS_PER_MS


def _labels(values: tuple[str, ...], index: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=object)[index]


def _draw_customers(
    rng: np.random.Generator, config: SyntheticConfig, merch: _MerchantLatent
) -> tuple[pd.DataFrame, _CustomerLatent]:
    n = config.n_customers
    age = rng.choice(len(AGE_GROUPS), size=n, p=_AGE_PROBS)
    region = rng.choice(len(REGIONS), size=n, p=_REGION_PROBS)
    signup_days = rng.uniform(*_SIGNUP_DAYS, size=n)
    signup_ns = _start_ns(config) - _seconds_to_ns(signup_days * _SECONDS_PER_DAY)
    habit = rng.lognormal(math.log(_HABIT_MEDIAN), _HABIT_SIGMA, size=n) * _AGE_AMOUNT_MULT[age]
    rate_scale = config.mean_txns_per_customer_day / _RATE_GAMMA_SHAPE
    rate = rng.gamma(_RATE_GAMMA_SHAPE, rate_scale, size=n) * _AGE_RATE_MULT[age]
    hour_shift = rng.integers(-2, 3, size=n)
    preferred = rng.choice(merch.popularity.shape[0], size=(n, _N_PREFERRED), p=merch.popularity)
    frame = pd.DataFrame(
        {
            "customer_id": np.arange(1, n + 1, dtype=np.int64),
            "age_group": _labels(AGE_GROUPS, age),
            "home_region": _labels(REGIONS, region),
            "signup_ts": _to_utc(signup_ns),
        }
    )
    latent = _CustomerLatent(
        habit=habit,
        rate=rate,
        preferred=preferred,
        hour_shift=hour_shift,
        online_bias=_AGE_ONLINE_BIAS[age],
    )
    return frame, latent


def _draw_merchants(
    rng: np.random.Generator, config: SyntheticConfig
) -> tuple[pd.DataFrame, _MerchantLatent]:
    n = config.n_merchants
    category = rng.choice(len(CATEGORIES), size=n, p=_CATEGORY_PROBS)
    popularity = rng.lognormal(0.0, 1.0, size=n)
    risk_draw = rng.random(n)
    is_high = risk_draw < _CATEGORY_HIGH_RISK_PROB[category]
    if not is_high.any():  # small worlds still need a risky merchant
        is_high[np.argmin(risk_draw / _CATEGORY_HIGH_RISK_PROB[category])] = True
    risk = np.where(
        is_high,
        rng.uniform(*_HIGH_RISK_RANGE, size=n),
        rng.uniform(*_LOW_RISK_RANGE, size=n),
    )
    frame = pd.DataFrame(
        {
            "merchant_id": np.arange(1, n + 1, dtype=np.int64),
            "category": _labels(CATEGORIES, category),
        }
    )
    latent = _MerchantLatent(
        category_index=category,
        popularity=popularity / popularity.sum(),
        risk=risk,
        high_risk=np.flatnonzero(is_high),
    )
    return frame, latent


def _habitual_fraud_probability(cust: _CustomerLatent, merch: _MerchantLatent) -> np.ndarray:
    """Per-merchant fraud probability of a habitual purchase, proportional to risk."""
    n_merchants = merch.risk.shape[0]
    preferred_traffic = np.bincount(
        cust.preferred.ravel(),
        weights=(cust.rate[:, None] * _PREFERRED_WEIGHTS[None, :]).ravel(),
        minlength=n_merchants,
    )
    anywhere_traffic = cust.rate.sum() * merch.popularity
    traffic = _P_PREFERRED * preferred_traffic + (1 - _P_PREFERRED) * anywhere_traffic
    mean_risk = float(np.average(merch.risk, weights=traffic)) if traffic.sum() > 0 else 1.0
    return np.minimum(merch.risk * (_HABITUAL_FRAUD_RATE / mean_risk), _MAX_HABITUAL_FRAUD_P)


def _day_weights(config: SyntheticConfig) -> np.ndarray:
    first_weekday = pd.Timestamp(config.start).tz_convert("UTC").weekday()
    weekday = (first_weekday + np.arange(config.days)) % 7
    weights = np.where(weekday >= 5, _WEEKEND_WEIGHT, 1.0)
    return weights / weights.sum()


def _diurnal_offsets(
    rng: np.random.Generator, config: SyntheticConfig, hour_shift: np.ndarray
) -> np.ndarray:
    """Seconds since start for events following the weekly and daily rhythm."""
    n = len(hour_shift)
    day = rng.choice(config.days, size=n, p=_day_weights(config))
    hour = rng.choice(24, size=n, p=_HOUR_WEIGHTS / _HOUR_WEIGHTS.sum())
    hour = (hour + hour_shift) % 24
    return day * float(_SECONDS_PER_DAY) + (hour + rng.random(n)) * 3600.0


def _pick_merchants(
    rng: np.random.Generator, customer: np.ndarray, cust: _CustomerLatent, merch: _MerchantLatent
) -> np.ndarray:
    n = customer.shape[0]
    slot = rng.choice(_N_PREFERRED, size=n, p=_PREFERRED_WEIGHTS)
    preferred = cust.preferred[customer, slot]
    anywhere = rng.choice(merch.popularity.shape[0], size=n, p=merch.popularity)
    return np.where(rng.random(n) < _P_PREFERRED, preferred, anywhere)


def _habitual_amounts(
    rng: np.random.Generator, customer: np.ndarray, merchant: np.ndarray,
    cust: _CustomerLatent, merch: _MerchantLatent,
) -> np.ndarray:
    noise = rng.lognormal(0.0, _AMOUNT_SIGMA, size=customer.shape[0])
    return cust.habit[customer] * _CATEGORY_AMOUNT_MULT[merch.category_index[merchant]] * noise


def _habitual_channel(
    rng: np.random.Generator, customer: np.ndarray, merchant: np.ndarray,
    cust: _CustomerLatent, merch: _MerchantLatent,
) -> np.ndarray:
    p_online = _CATEGORY_ONLINE_PROB[merch.category_index[merchant]] + cust.online_bias[customer]
    return rng.random(customer.shape[0]) < np.clip(p_online, 0.01, 0.99)


def _habitual_fraud(
    rng: np.random.Generator, merchant: np.ndarray, online: np.ndarray, fraud_p: np.ndarray
) -> np.ndarray:
    factor = np.where(online, _ONLINE_FRAUD_FACTOR, _IN_STORE_FRAUD_FACTOR)
    return rng.random(merchant.shape[0]) < np.minimum(fraud_p[merchant] * factor, 1.0)


def _habitual_transactions(
    rng: np.random.Generator, config: SyntheticConfig,
    cust: _CustomerLatent, merch: _MerchantLatent, fraud_p: np.ndarray,
) -> _Block:
    counts = rng.poisson(cust.rate * config.days)
    customer = np.repeat(np.arange(counts.shape[0]), counts)
    offset = _diurnal_offsets(rng, config, cust.hour_shift[customer])
    merchant = _pick_merchants(rng, customer, cust, merch)
    amount = _habitual_amounts(rng, customer, merchant, cust, merch)
    online = _habitual_channel(rng, customer, merchant, cust, merch)
    fraud = _habitual_fraud(rng, merchant, online, fraud_p)
    return _Block(offset, customer, merchant, amount, online, fraud)


def _episode_offsets(
    rng: np.random.Generator, episode_start_s: np.ndarray, sizes: np.ndarray,
    hours: tuple[float, float],
) -> np.ndarray:
    """Spread each episode's transactions over its own 1..N hour window."""
    duration = rng.uniform(*hours, size=sizes.shape[0]) * 3600.0
    start = np.repeat(episode_start_s, sizes)
    return start + rng.random(start.shape[0]) * np.repeat(duration, sizes)


def _clip_to_period(offset_s: np.ndarray, config: SyntheticConfig) -> np.ndarray:
    return np.minimum(offset_s, config.days * float(_SECONDS_PER_DAY) - 1.0)


def _spree_transactions(
    rng: np.random.Generator, config: SyntheticConfig,
    cust: _CustomerLatent, merch: _MerchantLatent, fraud_p: np.ndarray,
) -> _Block:
    """Legitimate bursts: several ordinary purchases within an hour or two."""
    n_sprees = rng.poisson(_SPREES_PER_CUSTOMER_DAY * config.days, size=len(cust.habit))
    spree_customer = np.repeat(np.arange(n_sprees.shape[0]), n_sprees)
    sizes = rng.integers(_SPREE_SIZE[0], _SPREE_SIZE[1] + 1, size=spree_customer.shape[0])
    spree_start = _diurnal_offsets(rng, config, cust.hour_shift[spree_customer])
    offset = _clip_to_period(_episode_offsets(rng, spree_start, sizes, _SPREE_HOURS), config)
    customer = np.repeat(spree_customer, sizes)
    merchant = rng.choice(merch.popularity.shape[0], size=customer.shape[0], p=merch.popularity)
    amount = _habitual_amounts(rng, customer, merchant, cust, merch)
    online = rng.random(customer.shape[0]) < _SPREE_P_ONLINE
    fraud = _habitual_fraud(rng, merchant, online, fraud_p)
    return _Block(offset, customer, merchant, amount, online, fraud)


def _compromise_transactions(
    rng: np.random.Generator, config: SyntheticConfig,
    cust: _CustomerLatent, merch: _MerchantLatent,
) -> _Block:
    """Card compromise: one burst of large, mostly online, mostly risky purchases."""
    victims = np.flatnonzero(rng.random(cust.habit.shape[0]) < _P_COMPROMISED)
    sizes = rng.integers(_BURST_SIZE[0], _BURST_SIZE[1] + 1, size=victims.shape[0])
    latest_start = max(config.days * float(_SECONDS_PER_DAY) - _BURST_HOURS[1] * 3600.0, 0.0)
    burst_start = rng.uniform(0.0, latest_start, size=victims.shape[0])
    offset = _clip_to_period(_episode_offsets(rng, burst_start, sizes, _BURST_HOURS), config)
    customer = np.repeat(victims, sizes)
    n = customer.shape[0]
    risky = merch.high_risk[rng.integers(0, merch.high_risk.shape[0], size=n)]
    anywhere = rng.choice(merch.popularity.shape[0], size=n, p=merch.popularity)
    merchant = np.where(rng.random(n) < _BURST_P_HIGH_RISK, risky, anywhere)
    amount = cust.habit[customer] * rng.uniform(*_BURST_AMOUNT_MULT, size=n)
    online = rng.random(n) < _BURST_P_ONLINE
    fraud = rng.random(n) < _BURST_P_FRAUD
    return _Block(offset, customer, merchant, amount, online, fraud)


def _label_delay_ns(rng: np.random.Generator, n: int) -> np.ndarray:
    """Days until the label is known; drawn independently of the label itself."""
    low, high = _LABEL_DELAY_DAYS
    days = np.clip(low + rng.gamma(*_LABEL_DELAY_GAMMA, size=n), low, high)
    return _seconds_to_ns(days * _SECONDS_PER_DAY)


def _assemble(
    rng: np.random.Generator, config: SyntheticConfig, blocks: list[_Block]
) -> pd.DataFrame:
    def cat(field: str) -> np.ndarray:
        return np.concatenate([getattr(block, field) for block in blocks])

    event_ns = _start_ns(config) + _seconds_to_ns(cat("offset_s"))
    order = np.argsort(event_ns, kind="stable")
    event_ns = event_ns[order]
    n = event_ns.shape[0]
    amount = np.maximum(np.round(cat("amount")[order], 2), 0.01)
    online = cat("online")[order]
    return pd.DataFrame(
        {
            "transaction_id": np.arange(1, n + 1, dtype=np.int64),
            "event_timestamp": _to_utc(event_ns),
            "customer_id": cat("customer")[order].astype(np.int64) + 1,
            "merchant_id": cat("merchant")[order].astype(np.int64) + 1,
            "amount": amount.astype(np.float64),
            "channel": _labels(CHANNELS, online.astype(np.intp)),
            "is_fraud": cat("fraud")[order].astype(np.int64),
            "label_available_ts": _to_utc(event_ns + _label_delay_ns(rng, n)),
        }
    )


# --- persistence -----------------------------------------------------------------


def write_parquet_atomic(frame: pd.DataFrame, path: Path, row_group_size: int | None = None) -> None:
    """Write a parquet file so a reader sees the old file or the new one, never half of one."""
    # A unique sibling name rather than mkstemp, so the file gets the usual
    # umask-based permissions instead of mkstemp's 0600.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        frame.to_parquet(tmp, index=False, row_group_size=row_group_size)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write(data: SyntheticData, folder: Path) -> dict[str, Path]:
    """Write the three tables as parquet files into ``folder``, each atomically."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = {
        "customers": (data.customers, folder / CUSTOMERS_FILE),
        "merchants": (data.merchants, folder / MERCHANTS_FILE),
        "transactions": (data.transactions, folder / TRANSACTIONS_FILE),
    }
    for name, (frame, path) in tables.items():
        write_parquet_atomic(frame, path)
        logger.debug("wrote %s (%d rows) to %s", name, len(frame), path)
    return {name: path for name, (_, path) in tables.items()}


def read_transactions(folder: Path) -> pd.DataFrame:
    """Read ``transactions.parquet`` from ``folder``."""
    path = Path(folder) / TRANSACTIONS_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"synthetic transactions not found at {path}; generate them with "
            f"`python -m feature_repo.synthetic --out {Path(folder)}`"
        )
    return pd.read_parquet(path)


# --- CLI ---------------------------------------------------------------------------


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    defaults = SyntheticConfig()
    parser = argparse.ArgumentParser(
        prog="python -m feature_repo.synthetic",
        description="Generate a synthetic card-payment fraud data set as parquet files.",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument("--customers", type=int, default=defaults.n_customers)
    parser.add_argument("--merchants", type=int, default=defaults.n_merchants)
    parser.add_argument("--days", type=int, default=defaults.days)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--txns-per-day", type=float, default=defaults.mean_txns_per_customer_day,
        help="mean transactions per customer and day",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = _parse_args(argv)
    try:
        config = SyntheticConfig(
            n_customers=args.customers,
            n_merchants=args.merchants,
            days=args.days,
            seed=args.seed,
            mean_txns_per_customer_day=args.txns_per_day,
        )
    except ValueError as exc:
        logger.error("invalid configuration: %s", exc)
        return 2
    data = generate(config)
    paths = write(data, args.out)
    txns = data.transactions
    positives = int(txns["is_fraud"].sum())
    logger.info(
        "customers=%d merchants=%d transactions=%d positives=%d (%.2f%%)",
        len(data.customers), len(data.merchants), len(txns), positives,
        100.0 * positives / max(len(txns), 1),
    )
    for name, path in paths.items():
        logger.info("%s -> %s", name, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
