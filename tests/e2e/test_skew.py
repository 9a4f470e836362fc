"""The skew flow on a live gateway: a serving-side transform bug is caught by parity, naming the feature.

The bug is real serving code, not a doctored log: a replica started while the registry held a wrong
version of the on-demand transform (``log`` where training has ``log1p``) keeps that transform (its
registry never reloads), while the offline recomputation reads the restored, correct definition.
"""

from __future__ import annotations

from typing import Any

import pytest
from feast import Field
from feast.on_demand_feature_view import on_demand_feature_view
from feast.types import Float64

from feature_repo import store as feature_store
from feature_repo import synthetic
from feature_repo.data_sources import transaction_request
from feature_repo.features import customer_activity
from serving.gateway.process import wait_endpoint_ready
from serving.inference_log import read_inference_log
from tests.waiting import until
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

ENDPOINT = "paritybug"


@on_demand_feature_view(
    sources=[customer_activity, transaction_request],
    schema=[Field(name="amount_to_mean_7d", dtype=Float64), Field(name="log_amount", dtype=Float64)],
    mode="python",
)
def transaction_context(inputs: dict[str, Any]) -> dict[str, Any]:
    """The repository's transform with one bug: log(amount) where the definition says log1p(amount)."""
    import math

    amounts = [float(a) for a in inputs["amount"]]
    means = inputs["cust_mean_amount_7d"]
    ratios = [a / float(m) if m is not None and float(m) > 0 else 1.0 for a, m in zip(amounts, means)]
    return {"amount_to_mean_7d": ratios, "log_amount": [math.log(max(a, 1e-9)) for a in amounts]}


@pytest.fixture(scope="module")
def buggy_endpoint(world, gateway):
    store = feature_store.open_store(world.home)
    try:
        store.apply([transaction_context])
        with gateway.client(gateway.admin) as api:
            created = api.post(
                "/api/2.0/serving-endpoints",
                json={
                    "name": ENDPOINT,
                    "config": {
                        "served_entities": [{"entity_name": MODEL_NAME, "entity_version": world.trained["version"]}]
                    },
                },
            )
            assert created.status_code == 200, created.text
        wait_endpoint_ready(gateway.url, gateway.admin, ENDPOINT)
    finally:
        feature_store.apply_definitions(feature_store.open_store(world.home))  # the registry is right again
    yield ENDPOINT
    with gateway.client(gateway.admin) as api:
        api.delete(f"/api/2.0/serving-endpoints/{ENDPOINT}")


def test_a_serving_side_transform_bug_is_caught_by_parity_naming_the_feature(world, gateway, buggy_endpoint):
    from flows.skew import skew

    rows = synthetic.read_transactions(world.settings.data_dir).sample(80, random_state=31)
    sent = len(gateway.sent)
    for row in rows[["customer_id", "merchant_id", "amount"]].to_dict(orient="records"):
        reply = gateway.invoke({"dataframe_records": [row]}, endpoint=ENDPOINT)
        assert reply.status_code == 200, reply.text
    ids = set(gateway.sent[sent:])

    def logged() -> bool:  # the inference log is written off the request path, about every second
        return ids <= set(read_inference_log(world.settings.inference_log_dir, endpoint=ENDPOINT)["request_id"])

    until(logged, "the requests never reached the inference log", timeout_s=30, every_s=0.2)
    result = skew(endpoint=ENDPOINT, fail_on_finding=False, min_rows=50)
    (entry,) = result["versions"].values()
    assert entry["parity_rows"] == 80 and entry["parity_mismatched"] == ["log_amount"]
    assert f"skew {MODEL_NAME}/{world.trained['version']}:log_amount" in result["findings"]
    assert result["verdict"] == "findings" and entry["report"].endswith(".html")
    with pytest.raises(RuntimeError, match="log_amount"):
        skew(endpoint=ENDPOINT, min_rows=50)
