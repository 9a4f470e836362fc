"""Entities: the keys features are joined on."""

from __future__ import annotations

from feast import Entity, ValueType

customer = Entity(name="customer", join_keys=["customer_id"], value_type=ValueType.INT64, description="A card holder.")

merchant = Entity(
    name="merchant", join_keys=["merchant_id"], value_type=ValueType.INT64, description="A card acceptor."
)
