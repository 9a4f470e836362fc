"""The real databricks-sdk drives the gateway unchanged: create (and wait), get, list, update the
traffic split, query, metrics, openapi, ai-gateway, delete."""

from __future__ import annotations

import pytest
from databricks.sdk import WorkspaceClient
from databricks.sdk.errors import NotFound, ResourceAlreadyExists
from databricks.sdk.service.serving import (
    AiGatewayInferenceTableConfig,
    EndpointCoreConfigInput,
    EndpointStateConfigUpdate,
    EndpointStateReady,
    Route,
    ServedEntityInput,
    TrafficConfig,
)

from feature_repo import synthetic
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

NAME = "sdk-fraud"


@pytest.fixture(scope="module")
def w(gateway):
    return WorkspaceClient(host=gateway.url, token=gateway.admin)


def entity(name: str) -> ServedEntityInput:
    return ServedEntityInput(
        name=name, entity_name=MODEL_NAME, entity_version="1", workload_size="Small", scale_to_zero_enabled=False
    )


def test_the_sdk_manages_and_queries_an_endpoint(w, world):
    created = w.serving_endpoints.create_and_wait(
        name=NAME, config=EndpointCoreConfigInput(name=NAME, served_entities=[entity("blue")])
    )
    assert created.state.ready == EndpointStateReady.READY
    assert created.state.config_update == EndpointStateConfigUpdate.NOT_UPDATING
    assert created.config.served_entities[0].entity_version == "1"

    with pytest.raises(ResourceAlreadyExists):
        w.serving_endpoints.create(
            name=NAME, config=EndpointCoreConfigInput(name=NAME, served_entities=[entity("blue")])
        )
    assert NAME in [e.name for e in w.serving_endpoints.list()]
    assert w.serving_endpoints.get(NAME).name == NAME

    rows = synthetic.read_transactions(world.settings.data_dir).head(3)[["customer_id", "merchant_id", "amount"]]
    answer = w.serving_endpoints.query(NAME, dataframe_records=rows.to_dict(orient="records"))
    assert answer.served_model_name == "blue" and len(answer.predictions) == 3

    # a traffic change: a second served entity, then all traffic to it; the old one keeps serving until then
    split = w.serving_endpoints.update_config_and_wait(
        NAME,
        served_entities=[entity("blue"), entity("green")],
        traffic_config=TrafficConfig(
            routes=[
                Route(served_model_name="blue", traffic_percentage=0),
                Route(served_model_name="green", traffic_percentage=100),
            ]
        ),
    )
    assert split.state.config_update == EndpointStateConfigUpdate.NOT_UPDATING
    served_by = {
        w.serving_endpoints.query(NAME, dataframe_records=rows.to_dict(orient="records")).served_model_name
        for _ in range(8)
    }
    assert served_by == {"green"}

    metrics = w.serving_endpoints.export_metrics(NAME)
    text = metrics.contents.read().decode()
    assert f'endpoint="{NAME}"' in text and 'endpoint="fraud"' not in text

    spec = w.serving_endpoints.get_open_api(NAME).contents.read().decode()
    assert "customer_id" in spec and "amount" in spec and f"/serving-endpoints/{NAME}/invocations" in spec
    assert f"/v2/models/{NAME}/infer" in spec  # the Open Inference Protocol's route of the same endpoint

    gateway_config = w.serving_endpoints.put_ai_gateway(
        NAME, inference_table_config=AiGatewayInferenceTableConfig(enabled=True, table_name_prefix="fraud")
    )
    assert gateway_config.inference_table_config.enabled

    w.serving_endpoints.delete(NAME)
    with pytest.raises(NotFound):
        w.serving_endpoints.get(NAME)
