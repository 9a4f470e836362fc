"""Deterministic synthetic card-payment fraud data (``python -m feature_repo.synthetic --help``).

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

from feature_repo.synthetic.cli import main
from feature_repo.synthetic.config import AGE_GROUPS, CATEGORIES, CHANNELS, REGIONS, SyntheticConfig, SyntheticData
from feature_repo.synthetic.files import (
    CUSTOMERS_FILE,
    MERCHANTS_FILE,
    TRANSACTIONS_FILE,
    read_transactions,
    write,
    write_parquet_atomic,
)
from feature_repo.synthetic.generator import generate

__all__ = [
    "AGE_GROUPS",
    "CATEGORIES",
    "CHANNELS",
    "CUSTOMERS_FILE",
    "MERCHANTS_FILE",
    "REGIONS",
    "TRANSACTIONS_FILE",
    "SyntheticConfig",
    "SyntheticData",
    "generate",
    "main",
    "read_transactions",
    "write",
    "write_parquet_atomic",
]
