"""The whole data set from one seed: merchants, then customers, then the three kinds of transactions."""

from __future__ import annotations

import numpy as np

from feature_repo.synthetic.config import SyntheticConfig, SyntheticData
from feature_repo.synthetic.population import draw_customers, draw_merchants, habitual_fraud_probability
from feature_repo.synthetic.transactions import (
    assemble,
    compromise_transactions,
    habitual_transactions,
    spree_transactions,
)


def generate(config: SyntheticConfig) -> SyntheticData:
    """Generate customers, merchants and transactions; same seed, same frames."""
    rng = np.random.default_rng(config.seed)
    merchants, merch = draw_merchants(rng, config)
    customers, cust = draw_customers(rng, config, merch)
    fraud_p = habitual_fraud_probability(cust, merch)
    blocks = [
        habitual_transactions(rng, config, cust, merch, fraud_p),
        spree_transactions(rng, config, cust, merch, fraud_p),
        compromise_transactions(rng, config, cust, merch),
    ]
    transactions = assemble(rng, config, blocks)
    return SyntheticData(customers=customers, merchants=merchants, transactions=transactions)
