"""Customers and merchants: the exported tables and the latent traits transactions are drawn from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from feature_repo.synthetic.columns import SECONDS_PER_DAY, labels, seconds_to_ns, start_ns, to_utc
from feature_repo.synthetic.config import AGE_GROUPS, CATEGORIES, REGIONS, SyntheticConfig
from feature_repo.synthetic.parameters import (
    AGE_AMOUNT_MULT,
    AGE_ONLINE_BIAS,
    AGE_PROBS,
    AGE_RATE_MULT,
    CATEGORY_HIGH_RISK_PROB,
    CATEGORY_PROBS,
    HABIT_MEDIAN,
    HABIT_SIGMA,
    HABITUAL_FRAUD_RATE,
    HIGH_RISK_RANGE,
    LOW_RISK_RANGE,
    MAX_HABITUAL_FRAUD_P,
    N_PREFERRED,
    P_PREFERRED,
    PREFERRED_WEIGHTS,
    RATE_GAMMA_SHAPE,
    REGION_PROBS,
    SIGNUP_DAYS,
)


@dataclass(frozen=True)
class CustomerLatent:
    habit: np.ndarray
    rate: np.ndarray
    preferred: np.ndarray  # (n_customers, N_PREFERRED) merchant indices
    hour_shift: np.ndarray
    online_bias: np.ndarray


@dataclass(frozen=True)
class MerchantLatent:
    category_index: np.ndarray
    popularity: np.ndarray  # sums to 1
    risk: np.ndarray  # relative latent risk score
    high_risk: np.ndarray  # indices of high-risk merchants


def draw_customers(
    rng: np.random.Generator, config: SyntheticConfig, merch: MerchantLatent
) -> tuple[pd.DataFrame, CustomerLatent]:
    n = config.n_customers
    age = rng.choice(len(AGE_GROUPS), size=n, p=AGE_PROBS)
    region = rng.choice(len(REGIONS), size=n, p=REGION_PROBS)
    signup_days = rng.uniform(*SIGNUP_DAYS, size=n)
    signup_ns = start_ns(config) - seconds_to_ns(signup_days * SECONDS_PER_DAY)
    habit = rng.lognormal(math.log(HABIT_MEDIAN), HABIT_SIGMA, size=n) * AGE_AMOUNT_MULT[age]
    rate_scale = config.mean_txns_per_customer_day / RATE_GAMMA_SHAPE
    rate = rng.gamma(RATE_GAMMA_SHAPE, rate_scale, size=n) * AGE_RATE_MULT[age]
    hour_shift = rng.integers(-2, 3, size=n)
    preferred = rng.choice(merch.popularity.shape[0], size=(n, N_PREFERRED), p=merch.popularity)
    frame = pd.DataFrame(
        {
            "customer_id": np.arange(1, n + 1, dtype=np.int64),
            "age_group": labels(AGE_GROUPS, age),
            "home_region": labels(REGIONS, region),
            "signup_ts": to_utc(signup_ns),
        }
    )
    latent = CustomerLatent(
        habit=habit, rate=rate, preferred=preferred, hour_shift=hour_shift, online_bias=AGE_ONLINE_BIAS[age]
    )
    return frame, latent


def draw_merchants(rng: np.random.Generator, config: SyntheticConfig) -> tuple[pd.DataFrame, MerchantLatent]:
    n = config.n_merchants
    category = rng.choice(len(CATEGORIES), size=n, p=CATEGORY_PROBS)
    popularity = rng.lognormal(0.0, 1.0, size=n)
    risk_draw = rng.random(n)
    is_high = risk_draw < CATEGORY_HIGH_RISK_PROB[category]
    if not is_high.any():  # small worlds still need a risky merchant
        is_high[np.argmin(risk_draw / CATEGORY_HIGH_RISK_PROB[category])] = True
    risk = np.where(is_high, rng.uniform(*HIGH_RISK_RANGE, size=n), rng.uniform(*LOW_RISK_RANGE, size=n))
    frame = pd.DataFrame({"merchant_id": np.arange(1, n + 1, dtype=np.int64), "category": labels(CATEGORIES, category)})
    latent = MerchantLatent(
        category_index=category, popularity=popularity / popularity.sum(), risk=risk, high_risk=np.flatnonzero(is_high)
    )
    return frame, latent


def habitual_fraud_probability(cust: CustomerLatent, merch: MerchantLatent) -> np.ndarray:
    """Per-merchant fraud probability of a habitual purchase, proportional to risk."""
    n_merchants = merch.risk.shape[0]
    preferred_traffic = np.bincount(
        cust.preferred.ravel(), weights=(cust.rate[:, None] * PREFERRED_WEIGHTS[None, :]).ravel(), minlength=n_merchants
    )
    anywhere_traffic = cust.rate.sum() * merch.popularity
    traffic = P_PREFERRED * preferred_traffic + (1 - P_PREFERRED) * anywhere_traffic
    mean_risk = float(np.average(merch.risk, weights=traffic)) if traffic.sum() > 0 else 1.0
    return np.minimum(merch.risk * (HABITUAL_FRAUD_RATE / mean_risk), MAX_HABITUAL_FRAUD_P)
