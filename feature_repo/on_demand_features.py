"""Request-time transforms, run by Feast identically for training and serving.

Feast stores the transform's source and runs it without this module's globals, so the function is
self-contained: its imports and constants live inside it.
"""

from __future__ import annotations

from typing import Any

from feast import Field
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float64

from feature_repo.data_sources import transaction_request
from feature_repo.features import customer_activity


@on_demand_feature_view(
    sources=[customer_activity, transaction_request],
    schema=[Field(name="amount_to_mean_7d", dtype=Float64), Field(name="log_amount", dtype=Float64)],
    mode="python",
)
def transaction_context(inputs: dict[str, Any]) -> dict[str, Any]:
    """The amount against the customer's 7-day mean (1.0 with no spend in 7 days), and log1p(amount)."""
    import math

    amounts = [float(a) for a in inputs["amount"]]
    means = inputs["cust_mean_amount_7d"]
    ratios = [a / float(m) if m is not None and float(m) > 0 else 1.0 for a, m in zip(amounts, means)]
    return {"amount_to_mean_7d": ratios, "log_amount": [math.log1p(max(a, 0.0)) for a in amounts]}
