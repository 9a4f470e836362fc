"""Transactions: habitual purchases, legitimate sprees and card compromises, then one sorted table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from feature_repo.synthetic.columns import SECONDS_PER_DAY, labels, seconds_to_ns, start_ns, to_utc
from feature_repo.synthetic.config import CHANNELS, SyntheticConfig
from feature_repo.synthetic.parameters import (
    AMOUNT_SIGMA,
    BURST_AMOUNT_MULT,
    BURST_HOURS,
    BURST_P_FRAUD,
    BURST_P_HIGH_RISK,
    BURST_P_ONLINE,
    BURST_SIZE,
    CATEGORY_AMOUNT_MULT,
    CATEGORY_ONLINE_PROB,
    HOUR_WEIGHTS,
    IN_STORE_FRAUD_FACTOR,
    LABEL_DELAY_DAYS,
    LABEL_DELAY_GAMMA,
    N_PREFERRED,
    ONLINE_FRAUD_FACTOR,
    P_COMPROMISED,
    P_PREFERRED,
    PREFERRED_WEIGHTS,
    SPREE_HOURS,
    SPREE_P_ONLINE,
    SPREE_SIZE,
    SPREES_PER_CUSTOMER_DAY,
    WEEKEND_WEIGHT,
)
from feature_repo.synthetic.population import CustomerLatent, MerchantLatent


@dataclass(frozen=True)
class Block:
    """Transactions of one kind, unsorted; time as seconds since start."""

    offset_s: np.ndarray
    customer: np.ndarray
    merchant: np.ndarray
    amount: np.ndarray
    online: np.ndarray
    fraud: np.ndarray


def _day_weights(config: SyntheticConfig) -> np.ndarray:
    first_weekday = pd.Timestamp(config.start).tz_convert("UTC").weekday()
    weekday = (first_weekday + np.arange(config.days)) % 7
    weights = np.where(weekday >= 5, WEEKEND_WEIGHT, 1.0)
    return weights / weights.sum()


def _diurnal_offsets(rng: np.random.Generator, config: SyntheticConfig, hour_shift: np.ndarray) -> np.ndarray:
    """Seconds since start for events following the weekly and daily rhythm."""
    n = len(hour_shift)
    day = rng.choice(config.days, size=n, p=_day_weights(config))
    hour = rng.choice(24, size=n, p=HOUR_WEIGHTS / HOUR_WEIGHTS.sum())
    hour = (hour + hour_shift) % 24
    return day * float(SECONDS_PER_DAY) + (hour + rng.random(n)) * 3600.0


def _pick_merchants(
    rng: np.random.Generator, customer: np.ndarray, cust: CustomerLatent, merch: MerchantLatent
) -> np.ndarray:
    n = customer.shape[0]
    slot = rng.choice(N_PREFERRED, size=n, p=PREFERRED_WEIGHTS)
    preferred = cust.preferred[customer, slot]
    anywhere = rng.choice(merch.popularity.shape[0], size=n, p=merch.popularity)
    return np.where(rng.random(n) < P_PREFERRED, preferred, anywhere)


def _habitual_amounts(
    rng: np.random.Generator, customer: np.ndarray, merchant: np.ndarray, cust: CustomerLatent, merch: MerchantLatent
) -> np.ndarray:
    noise = rng.lognormal(0.0, AMOUNT_SIGMA, size=customer.shape[0])
    return cust.habit[customer] * CATEGORY_AMOUNT_MULT[merch.category_index[merchant]] * noise


def _habitual_channel(
    rng: np.random.Generator, customer: np.ndarray, merchant: np.ndarray, cust: CustomerLatent, merch: MerchantLatent
) -> np.ndarray:
    p_online = CATEGORY_ONLINE_PROB[merch.category_index[merchant]] + cust.online_bias[customer]
    return rng.random(customer.shape[0]) < np.clip(p_online, 0.01, 0.99)


def _habitual_fraud(
    rng: np.random.Generator, merchant: np.ndarray, online: np.ndarray, fraud_p: np.ndarray
) -> np.ndarray:
    factor = np.where(online, ONLINE_FRAUD_FACTOR, IN_STORE_FRAUD_FACTOR)
    return rng.random(merchant.shape[0]) < np.minimum(fraud_p[merchant] * factor, 1.0)


def habitual_transactions(
    rng: np.random.Generator, config: SyntheticConfig, cust: CustomerLatent, merch: MerchantLatent, fraud_p: np.ndarray
) -> Block:
    counts = rng.poisson(cust.rate * config.days)
    customer = np.repeat(np.arange(counts.shape[0]), counts)
    offset = _diurnal_offsets(rng, config, cust.hour_shift[customer])
    merchant = _pick_merchants(rng, customer, cust, merch)
    amount = _habitual_amounts(rng, customer, merchant, cust, merch)
    online = _habitual_channel(rng, customer, merchant, cust, merch)
    fraud = _habitual_fraud(rng, merchant, online, fraud_p)
    return Block(offset, customer, merchant, amount, online, fraud)


def _episode_offsets(
    rng: np.random.Generator, episode_start_s: np.ndarray, sizes: np.ndarray, hours: tuple[float, float]
) -> np.ndarray:
    """Spread each episode's transactions over its own 1..N hour window."""
    duration = rng.uniform(*hours, size=sizes.shape[0]) * 3600.0
    start = np.repeat(episode_start_s, sizes)
    return start + rng.random(start.shape[0]) * np.repeat(duration, sizes)


def _clip_to_period(offset_s: np.ndarray, config: SyntheticConfig) -> np.ndarray:
    return np.minimum(offset_s, config.days * float(SECONDS_PER_DAY) - 1.0)


def spree_transactions(
    rng: np.random.Generator, config: SyntheticConfig, cust: CustomerLatent, merch: MerchantLatent, fraud_p: np.ndarray
) -> Block:
    """Legitimate bursts: several ordinary purchases within an hour or two."""
    n_sprees = rng.poisson(SPREES_PER_CUSTOMER_DAY * config.days, size=len(cust.habit))
    spree_customer = np.repeat(np.arange(n_sprees.shape[0]), n_sprees)
    sizes = rng.integers(SPREE_SIZE[0], SPREE_SIZE[1] + 1, size=spree_customer.shape[0])
    spree_start = _diurnal_offsets(rng, config, cust.hour_shift[spree_customer])
    offset = _clip_to_period(_episode_offsets(rng, spree_start, sizes, SPREE_HOURS), config)
    customer = np.repeat(spree_customer, sizes)
    merchant = rng.choice(merch.popularity.shape[0], size=customer.shape[0], p=merch.popularity)
    amount = _habitual_amounts(rng, customer, merchant, cust, merch)
    online = rng.random(customer.shape[0]) < SPREE_P_ONLINE
    fraud = _habitual_fraud(rng, merchant, online, fraud_p)
    return Block(offset, customer, merchant, amount, online, fraud)


def compromise_transactions(
    rng: np.random.Generator, config: SyntheticConfig, cust: CustomerLatent, merch: MerchantLatent
) -> Block:
    """Card compromise: one burst of large, mostly online, mostly risky purchases."""
    victims = np.flatnonzero(rng.random(cust.habit.shape[0]) < P_COMPROMISED)
    sizes = rng.integers(BURST_SIZE[0], BURST_SIZE[1] + 1, size=victims.shape[0])
    latest_start = max(config.days * float(SECONDS_PER_DAY) - BURST_HOURS[1] * 3600.0, 0.0)
    burst_start = rng.uniform(0.0, latest_start, size=victims.shape[0])
    offset = _clip_to_period(_episode_offsets(rng, burst_start, sizes, BURST_HOURS), config)
    customer = np.repeat(victims, sizes)
    n = customer.shape[0]
    risky = merch.high_risk[rng.integers(0, merch.high_risk.shape[0], size=n)]
    anywhere = rng.choice(merch.popularity.shape[0], size=n, p=merch.popularity)
    merchant = np.where(rng.random(n) < BURST_P_HIGH_RISK, risky, anywhere)
    amount = cust.habit[customer] * rng.uniform(*BURST_AMOUNT_MULT, size=n)
    online = rng.random(n) < BURST_P_ONLINE
    fraud = rng.random(n) < BURST_P_FRAUD
    return Block(offset, customer, merchant, amount, online, fraud)


def _label_delay_ns(rng: np.random.Generator, n: int) -> np.ndarray:
    """Days until the label is known; drawn independently of the label itself."""
    low, high = LABEL_DELAY_DAYS
    days = np.clip(low + rng.gamma(*LABEL_DELAY_GAMMA, size=n), low, high)
    return seconds_to_ns(days * SECONDS_PER_DAY)


def assemble(rng: np.random.Generator, config: SyntheticConfig, blocks: list[Block]) -> pd.DataFrame:
    def cat(field: str) -> np.ndarray:
        return np.concatenate([getattr(block, field) for block in blocks])

    event_ns = start_ns(config) + seconds_to_ns(cat("offset_s"))
    order = np.argsort(event_ns, kind="stable")
    event_ns = event_ns[order]
    n = event_ns.shape[0]
    amount = np.maximum(np.round(cat("amount")[order], 2), 0.01)
    online = cat("online")[order]
    return pd.DataFrame(
        {
            "transaction_id": np.arange(1, n + 1, dtype=np.int64),
            "event_timestamp": to_utc(event_ns),
            "customer_id": cat("customer")[order].astype(np.int64) + 1,
            "merchant_id": cat("merchant")[order].astype(np.int64) + 1,
            "amount": amount.astype(np.float64),
            "channel": labels(CHANNELS, online.astype(np.intp)),
            "is_fraud": cat("fraud")[order].astype(np.int64),
            "label_available_ts": to_utc(event_ns + _label_delay_ns(rng, n)),
        }
    )
