"""Batch feature views over the tables that ``feature_repo.aggregations`` computes."""

from __future__ import annotations

from datetime import timedelta

from feast import FeatureView, Field
from feast.types import Float64, Int64

from feature_repo.data_sources import customer_activity_source, merchant_risk_source
from feature_repo.entities import customer, merchant

# Every customer and merchant gets a snapshot at least once a day, so three days of TTL always finds
# one inside the data's span. An entity with no snapshot at all is unknown: serving answers 404.
SNAPSHOT_TTL = timedelta(days=3)

customer_activity = FeatureView(
    name="customer_activity",
    entities=[customer],
    ttl=SNAPSHOT_TTL,
    schema=[
        Field(name="cust_spend_1h", dtype=Float64),
        Field(name="cust_txn_count_1h", dtype=Int64),
        Field(name="cust_spend_24h", dtype=Float64),
        Field(name="cust_txn_count_24h", dtype=Int64),
        Field(name="cust_spend_7d", dtype=Float64),
        Field(name="cust_txn_count_7d", dtype=Int64),
        Field(name="cust_mean_amount_7d", dtype=Float64),
    ],
    source=customer_activity_source,
    online=True,
    tags={"owner": "fraud", "unknown_entity": "error"},
)

merchant_risk = FeatureView(
    name="merchant_risk",
    entities=[merchant],
    ttl=SNAPSHOT_TTL,
    schema=[Field(name="merch_fraud_rate_30d", dtype=Float64), Field(name="merch_txn_count_30d", dtype=Int64)],
    source=merchant_risk_source,
    online=True,
    tags={"owner": "fraud", "unknown_entity": "error"},
)
