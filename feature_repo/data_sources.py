"""Data sources: where the feature tables and request-time fields come from.

Paths are relative: Feast resolves them against the store's repo path, which tollfree sets to the
state folder (``TOLLFREE_HOME``), so nothing here depends on the working directory.
"""

from __future__ import annotations

from feast import Field, FileSource, RequestSource
from feast.types import Float64

CUSTOMER_ACTIVITY_PATH = "features/customer_activity.parquet"
MERCHANT_RISK_PATH = "features/merchant_risk.parquet"

customer_activity_source = FileSource(
    name="customer_activity_source",
    path=CUSTOMER_ACTIVITY_PATH,
    timestamp_field="feature_ts",
    description="Windowed spend aggregates per customer, computed by feature_repo.aggregations.",
)

merchant_risk_source = FileSource(
    name="merchant_risk_source",
    path=MERCHANT_RISK_PATH,
    timestamp_field="feature_ts",
    description="Daily merchant fraud-rate snapshots over labels known at that time.",
)

transaction_request = RequestSource(
    name="transaction_request",
    schema=[Field(name="amount", dtype=Float64)],
    description="Fields of the transaction being scored, known only at request time.",
)
