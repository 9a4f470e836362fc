"""Feature services: the versioned feature set each model is trained and served with."""

from __future__ import annotations

from feast import FeatureService

from feature_repo.features import customer_activity, merchant_risk
from feature_repo.on_demand_features import transaction_context

fraud_v1 = FeatureService(
    name="fraud_v1",
    features=[customer_activity, merchant_risk, transaction_context],
    description="Card-fraud model v1: customer velocity, merchant risk, amount vs habit.",
    tags={"model": "fraud"},
)
