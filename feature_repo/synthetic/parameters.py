"""The hidden generative parameters: they shape the data but never appear as columns."""

from __future__ import annotations

import numpy as np

AGE_PROBS = np.array([0.18, 0.34, 0.30, 0.18])
AGE_AMOUNT_MULT = np.array([0.75, 1.00, 1.15, 1.00])
AGE_RATE_MULT = np.array([1.10, 1.05, 0.95, 0.85])
AGE_ONLINE_BIAS = np.array([0.10, 0.05, -0.03, -0.10])
REGION_PROBS = np.array([0.24, 0.22, 0.20, 0.18, 0.16])

# Per category, in CATEGORIES order.
CATEGORY_PROBS = np.array([0.20, 0.18, 0.12, 0.07, 0.08, 0.15, 0.08, 0.07, 0.05])
CATEGORY_HIGH_RISK_PROB = np.array([0.02, 0.02, 0.02, 0.02, 0.02, 0.12, 0.08, 0.06, 0.25])
CATEGORY_AMOUNT_MULT = np.array([1.0, 0.7, 1.2, 0.6, 1.3, 1.2, 2.0, 2.2, 0.6])
CATEGORY_ONLINE_PROB = np.array([0.08, 0.10, 0.02, 0.15, 0.40, 0.95, 0.55, 0.70, 0.90])

HABIT_MEDIAN = 40.0
HABIT_SIGMA = 0.6
AMOUNT_SIGMA = 0.5
RATE_GAMMA_SHAPE = 3.0
N_PREFERRED = 3
PREFERRED_WEIGHTS = np.array([0.5, 0.3, 0.2])
P_PREFERRED = 0.75

# Latent merchant risk is a relative score; habitual fraud probability is the
# score times a constant calibrated so that the traffic-weighted habitual fraud
# rate is HABITUAL_FRAUD_RATE whatever merchants happen to be popular.
LOW_RISK_RANGE = (0.2, 1.0)
HIGH_RISK_RANGE = (8.0, 20.0)
HABITUAL_FRAUD_RATE = 0.022
MAX_HABITUAL_FRAUD_P = 0.4
ONLINE_FRAUD_FACTOR = 1.5
IN_STORE_FRAUD_FACTOR = 0.6

SPREES_PER_CUSTOMER_DAY = 0.015
SPREE_SIZE = (2, 6)
SPREE_HOURS = (0.5, 2.0)
SPREE_P_ONLINE = 0.2

P_COMPROMISED = 0.08
BURST_SIZE = (3, 12)
BURST_HOURS = (1.0, 3.0)
BURST_AMOUNT_MULT = (3.0, 10.0)
BURST_P_HIGH_RISK = 0.8
BURST_P_ONLINE = 0.85
BURST_P_FRAUD = 0.9

LABEL_DELAY_DAYS = (1.0, 14.0)
LABEL_DELAY_GAMMA = (2.0, 1.5)  # shape, scale (days); same for both labels.
SIGNUP_DAYS = (7.0, 5 * 365.0)

# Hour-of-day weights (UTC): quiet nights, lunch and evening peaks.
HOUR_WEIGHTS = np.array(
    [
        0.20,
        0.12,
        0.08,
        0.06,
        0.08,
        0.15,
        0.35,
        0.70,
        1.00,
        1.10,
        1.20,
        1.40,
        1.70,
        1.60,
        1.30,
        1.20,
        1.30,
        1.60,
        1.80,
        1.70,
        1.40,
        1.10,
        0.80,
        0.45,
    ]
)
WEEKEND_WEIGHT = 1.2
