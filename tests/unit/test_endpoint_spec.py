from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from serving.endpoints.spec import CreateEndpointRequest, EndpointCoreConfig, EndpointRecord, traffic_weights
from serving.endpoints.validation import normalize_config, validate_endpoint_name
from serving.endpoints.views import endpoint_view
from serving.protocol.errors import ApiError, install_error_handlers

SECRET = "SECRET-VALUE-123"

# What databricks-sdk 0.162 sends for
#   w.serving_endpoints.create(name="fraud", config=EndpointCoreConfigInput(name="fraud",
#       served_entities=[ServedEntityInput(entity_name="fraud_model", entity_version="3",
#           workload_size="Small", scale_to_zero_enabled=True, workload_type=ServingModelWorkloadType.CPU,
#           environment_vars={"LOG_LEVEL": "info"}), ServedEntityInput(name="challenger", ...)],
#       traffic_config=TrafficConfig(routes=[Route(served_model_name=..., traffic_percentage=...)]),
#       auto_capture_config=AutoCaptureConfigInput(catalog_name="ml", schema_name="serving", enabled=True)))
# test_sdk_body_matches_the_hand_written_one checks it against the SDK when that is installed.
SDK_CONFIG: dict[str, Any] = {
    "auto_capture_config": {"catalog_name": "ml", "enabled": True, "schema_name": "serving"},
    "name": "fraud",
    "served_entities": [
        {
            "entity_name": "fraud_model",
            "entity_version": "3",
            "environment_vars": {"LOG_LEVEL": "info"},
            "scale_to_zero_enabled": True,
            "workload_size": "Small",
            "workload_type": "CPU",
        },
        {"entity_name": "fraud_model", "entity_version": "4", "name": "challenger", "workload_size": "Small"},
    ],
    "traffic_config": {
        "routes": [
            {"served_model_name": "fraud_model-3", "traffic_percentage": 90},
            {"served_entity_name": "challenger", "traffic_percentage": 10},
        ]
    },
}
SDK_BODY: dict[str, Any] = {"name": "fraud", "config": SDK_CONFIG}


def _app() -> FastAPI:
    """Mirrors the gateway: spec models as FastAPI bodies, then name check and normalization."""
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/api/2.0/serving-endpoints")
    def create(body: CreateEndpointRequest) -> dict[str, Any]:
        validate_endpoint_name(body.name)
        return normalize_config(body.config, body.name).model_dump(mode="json", exclude_none=True)

    @app.put("/api/2.0/serving-endpoints/{name}/config")
    def update(name: str, body: EndpointCoreConfig) -> dict[str, Any]:
        return normalize_config(body, name).model_dump(mode="json", exclude_none=True)

    return app


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(_app())


def body_with(**changes: Any) -> dict[str, Any]:
    """SDK_BODY with changes at ``__``-separated paths (``config__served_entities__0__name="x"``); ``...`` deletes."""
    body = copy.deepcopy(SDK_BODY)
    for path, value in changes.items():
        *parents, last = path.split("__")
        node: Any = body
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        if value is ...:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return body


def error(client: TestClient, body: Any) -> str:
    response = client.post("/api/2.0/serving-endpoints", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    message = response.json()["message"]
    assert SECRET not in message
    return message


def spec_error(config: dict[str, Any], endpoint_name: str | None = None) -> str:
    with pytest.raises(ApiError) as info:
        normalize_config(EndpointCoreConfig.model_validate(config), endpoint_name)
    assert (info.value.status_code, info.value.error_code) == (400, "INVALID_PARAMETER_VALUE")
    assert SECRET not in info.value.message
    return info.value.message


def entity(**fields: Any) -> dict[str, Any]:
    return {"entity_name": "fraud_model", "entity_version": "3", **fields}


# ---- accepted bodies ---------------------------------------------------------------------------


def test_sdk_body_matches_the_hand_written_one() -> None:
    serving = pytest.importorskip("databricks.sdk.service.serving")
    config = serving.EndpointCoreConfigInput(
        name="fraud",
        served_entities=[
            serving.ServedEntityInput(
                entity_name="fraud_model",
                entity_version="3",
                workload_size="Small",
                scale_to_zero_enabled=True,
                workload_type=serving.ServingModelWorkloadType.CPU,
                environment_vars={"LOG_LEVEL": "info"},
            ),
            serving.ServedEntityInput(
                name="challenger", entity_name="fraud_model", entity_version="4", workload_size="Small"
            ),
        ],
        traffic_config=serving.TrafficConfig(
            routes=[
                serving.Route(served_model_name="fraud_model-3", traffic_percentage=90),
                serving.Route(served_entity_name="challenger", traffic_percentage=10),
            ]
        ),
        auto_capture_config=serving.AutoCaptureConfigInput(catalog_name="ml", schema_name="serving", enabled=True),
    )
    assert config.as_dict() == SDK_CONFIG


def test_sdk_create_body_is_accepted_and_normalized(client: TestClient) -> None:
    response = client.post("/api/2.0/serving-endpoints", json=SDK_BODY)
    assert response.status_code == 200, response.text
    config = response.json()
    first, second = config["served_entities"]
    assert first["name"] == "fraud_model-3"
    assert first["resolved_version"] == "3"
    assert (first["workload_type"], first["scale_to_zero_enabled"]) == ("CPU", True)
    assert first["environment_vars"] == {"LOG_LEVEL": "info"}
    assert second["name"] == "challenger" and second["scale_to_zero_enabled"] is False
    assert config["traffic_config"]["routes"] == [
        {"served_entity_name": "fraud_model-3", "traffic_percentage": 90},
        {"served_entity_name": "challenger", "traffic_percentage": 10},
    ]
    assert config["auto_capture_config"] == {"enabled": True, "catalog_name": "ml", "schema_name": "serving"}


def test_sdk_update_config_body_is_accepted(client: TestClient) -> None:
    body = {k: v for k, v in SDK_CONFIG.items() if k != "name"}  # update_config sends no name
    response = client.put("/api/2.0/serving-endpoints/fraud/config", json=body)
    assert response.status_code == 200, response.text


def test_mlflow_style_body_with_route_optimized_and_tags_is_accepted(client: TestClient) -> None:
    body = {**SDK_BODY, "route_optimized": False, "tags": [{"key": "team", "value": "risk"}, {"key": "x"}]}
    assert client.post("/api/2.0/serving-endpoints", json=body).status_code == 200


def test_single_entity_defaults_to_all_traffic_and_alias_naming() -> None:
    config = normalize_config(
        EndpointCoreConfig.model_validate(
            {"served_entities": [{"entity_name": "main.risk.fraud_model", "entity_alias": "champion"}]}
        )
    )
    [served] = config.served_entities
    assert served.name == "main.risk.fraud_model-champion"
    assert (served.entity_version, served.resolved_version) == (None, None)
    assert served.workload_size == "Small" and served.scale_to_zero_enabled is False
    assert traffic_weights(config) == [("main.risk.fraud_model-champion", 100)]


def test_integer_version_is_accepted_and_canonical() -> None:
    config = normalize_config(EndpointCoreConfig.model_validate({"served_entities": [entity(entity_version=7)]}))
    assert config.served_entities[0].entity_version == "7"
    config = normalize_config(EndpointCoreConfig.model_validate({"served_entities": [entity(entity_version="007")]}))
    assert config.served_entities[0].name == "fraud_model-7"


def test_normalize_is_idempotent_and_keeps_resolved_alias_version() -> None:
    config = normalize_config(EndpointCoreConfig.model_validate(SDK_CONFIG), "fraud")
    config.served_entities[1].resolved_version = "4"
    again = normalize_config(config, "fraud")
    assert again == config
    assert traffic_weights(again) == [("fraud_model-3", 90), ("challenger", 10)]


def test_unrouted_entity_gets_zero_traffic() -> None:
    config = normalize_config(
        EndpointCoreConfig.model_validate(
            {
                "served_entities": [entity(), entity(entity_version="4")],
                "traffic_config": {"routes": [{"served_entity_name": "fraud_model-4", "traffic_percentage": 100}]},
            }
        )
    )
    assert traffic_weights(config) == [("fraud_model-3", 0), ("fraud_model-4", 100)]


# ---- rejected bodies ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"config__traffic_config__routes__0__traffic_percentage": 80}, "sum to 90, not 100"),
        ({"config__traffic_config__routes__1__served_entity_name": "nobody"}, "traffic_config.routes[1] names no"),
        ({"config__served_entities__1__name": "fraud_model-3"}, "served_entities[1].name duplicates"),
        ({"config__served_entities__0__entity_alias": "champion"}, "served_entities[0]: set exactly one"),
        ({"config__served_entities__1__entity_version": ...}, "served_entities[1]: set exactly one"),
        ({"config__served_entities__0__entity_name": "team/fraud"}, "served_entities[0].entity_name"),
        ({"config__served_entities__0__entity_name": "s3://bucket/" + SECRET}, "served_entities[0].entity_name"),
        ({"config__served_entities__0__entity_name": "runs:/abc/model"}, "served_entities[0].entity_name"),
        ({"config__served_entities__0__entity_name": "../etc"}, "served_entities[0].entity_name"),
        ({"config__served_entities__1__entity_version": "4; drop"}, "served_entities[1].entity_version"),
        ({"config__served_entities__1__entity_version": "0"}, "served_entities[1].entity_version"),
        ({"config__traffic_config": ...}, "traffic_config is required with several served entities"),
        ({"config__traffic_config__routes__0__traffic_percentage": 190}, "routes[0].traffic_percentage"),
        ({"config__traffic_config__routes__0__served_entity_name": "challenger"}, "served_entity_name and served"),
        ({"config__traffic_config__routes__1__served_entity_name": "fraud_model-3"}, "same served entity as routes[0]"),
        ({"config__served_entities": []}, "served_entities must list 1 to 15"),
        ({"config__name": "other"}, "config.name must be the endpoint name"),
    ],
)
def test_invalid_configs_are_400_naming_the_field(client: TestClient, changes: dict[str, Any], expected: str) -> None:
    assert expected in error(client, body_with(**changes))


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"config__served_entities__0__instance_profile_arn": SECRET}, "served_entities[0].instance_profile_arn"),
        ({"config__served_entities__0__resolved_version": "9"}, "served_entities[0].resolved_version"),
        ({"config__served_entities__0__workload_type": "GPU_SMALL"}, "served_entities[0].workload_type"),
        ({"config__served_entities__0__workload_size": "Huge"}, "served_entities[0].workload_size"),
        ({"config__traffic_config__routes__0__traffic_percentage": 89.5}, "routes[0].traffic_percentage"),
        ({"config__traffic_config__routes__0__traffic_percentage": "90"}, "routes[0].traffic_percentage"),
        ({"config__served_entities__0__scale_to_zero_enabled": "yes"}, "served_entities[0].scale_to_zero_enabled"),
        ({"rate_limits": [{"calls": 1}]}, "rate_limits"),
        ({"config__served_models": [{"model_name": "m"}]}, "config.served_models"),
        ({"config": ...}, "config"),
    ],
)
def test_unknown_or_mistyped_fields_are_400_naming_the_field(
    client: TestClient, changes: dict[str, Any], field: str
) -> None:
    assert field in error(client, body_with(**changes))


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "served_entities[0].min_replicas (3) must be <= max_replicas (2)"),
        ({"min_replicas": -1}, "served_entities[0].min_replicas must be >= 0"),
        ({"max_replicas": 0}, "served_entities[0].max_replicas must be >= 1"),
        ({"min_replicas": 0}, "min_replicas must be 0 exactly when scale_to_zero_enabled"),
        ({"min_replicas": 1, "scale_to_zero_enabled": True}, "min_replicas must be 0 exactly when"),
        ({"max_concurrency": 0}, "served_entities[0].max_concurrency must be >= 1"),
        ({"entity_version": None, "entity_alias": "latest"}, "served_entities[0].entity_alias"),
        ({"entity_version": None, "entity_alias": "v2"}, "served_entities[0].entity_alias"),
        ({"entity_version": None, "entity_alias": "champ ion"}, "served_entities[0].entity_alias"),
        ({"environment_vars": {"BAD-NAME": "x"}}, "served_entities[0].environment_vars"),
        ({"name": "bad name"}, "served_entities[0].name"),
        ({"entity_name": "m" * 200}, "default name is too long"),
    ],
)
def test_invalid_entities_are_400_naming_the_field(fields: dict[str, Any], expected: str) -> None:
    assert expected in spec_error({"served_entities": [entity(**fields)]})


def test_sane_replica_bounds_are_accepted() -> None:
    config = normalize_config(
        EndpointCoreConfig.model_validate(
            {"served_entities": [entity(min_replicas=0, max_replicas=4, scale_to_zero_enabled=True, max_concurrency=8)]}
        )
    )
    assert (config.served_entities[0].min_replicas, config.served_entities[0].max_replicas) == (0, 4)


@pytest.mark.parametrize("name", ["", "has space", "dots.not.allowed", "slash/x", "a" * 64, "é"])
def test_bad_endpoint_names_are_400(client: TestClient, name: str) -> None:
    message = error(client, {**SDK_BODY, "name": name, "config": {**SDK_CONFIG, "name": name}})
    assert "1 to 63 letters, digits, dashes or underscores" in message


def test_long_endpoint_name_is_not_echoed_in_full() -> None:
    name = "x" * 63 + SECRET
    with pytest.raises(ApiError) as info:
        validate_endpoint_name(name)
    assert info.value.status_code == 400
    assert json.dumps("x" * 63) in info.value.message and SECRET not in info.value.message


@pytest.mark.parametrize("name", ["a", "fraud-model_2", "A" * 63])
def test_good_endpoint_names_pass(name: str) -> None:
    assert validate_endpoint_name(name) == name


# ---- records and views -------------------------------------------------------------------------


def record(**changes: Any) -> EndpointRecord:
    config = normalize_config(EndpointCoreConfig.model_validate(SDK_CONFIG), "fraud")
    base: dict[str, Any] = {
        "name": "fraud",
        "id": "0123456789abcdef0123456789abcdef",
        "creator": "alice",
        "created_ms": 1_700_000_000_000,
        "updated_ms": 1_700_000_000_500,
        "config": config,
        "config_version": 2,
        "ready": "READY",
        "config_update": "NOT_UPDATING",
        "pending_config": None,
        "ai_gateway": None,
        "state_message": None,
    }
    return EndpointRecord(**{**base, **changes})


def test_record_json_round_trip_keeps_alias_resolution() -> None:
    alias_config = normalize_config(
        EndpointCoreConfig.model_validate(
            {"served_entities": [{"entity_name": "fraud_model", "entity_alias": "champion"}]}
        )
    )
    alias_config.served_entities[0].resolved_version = "5"
    original = record(
        pending_config=alias_config,
        config_update="IN_PROGRESS",
        tags=[{"key": "team", "value": "r"}],
        ai_gateway={"usage_tracking_config": {"enabled": True}},
        revision=7,
    )
    text = original.to_json()
    assert "revision" not in json.loads(text)
    restored = EndpointRecord.from_json(text, revision=7)
    assert restored == original
    assert restored.pending_config is not None and restored.pending_config.served_entities[0].resolved_version == "5"


def test_record_rejects_unknown_states() -> None:
    with pytest.raises(ValueError):
        record(ready="MAYBE")
    with pytest.raises(ValueError):
        record(config_update="SOMETIMES")


def test_view_has_databricks_shape() -> None:
    view = endpoint_view(record())
    assert view["state"] == {"ready": "READY", "config_update": "NOT_UPDATING"}
    assert (view["creation_timestamp"], view["last_updated_timestamp"]) == (1_700_000_000_000, 1_700_000_000_500)
    config = view["config"]
    assert config["config_version"] == 2
    first = config["served_entities"][0]
    assert first["entity_name"] == "fraud_model" and first["entity_version"] == "3"
    assert first["state"] == {"deployment": "DEPLOYMENT_READY"}
    assert config["served_models"][1] == {
        "name": "challenger",
        "model_name": "fraud_model",
        "model_version": "4",
        "workload_size": "Small",
        "scale_to_zero_enabled": False,
        "state": {"deployment": "DEPLOYMENT_READY"},
    }
    assert config["traffic_config"]["routes"][0] == {
        "served_entity_name": "fraud_model-3",
        "served_model_name": "fraud_model-3",
        "traffic_percentage": 90,
    }
    assert config["auto_capture_config"]["catalog_name"] == "ml"
    assert "pending_config" not in view and "ai_gateway" not in view and "task" not in view
    json.dumps(view)


def test_view_while_updating_and_after_failure() -> None:
    new = normalize_config(EndpointCoreConfig.model_validate({"served_entities": [entity(entity_version="9")]}))
    updating = endpoint_view(record(pending_config=new, config_update="IN_PROGRESS", state_message="starting"))
    assert updating["state"]["config_update"] == "IN_PROGRESS"
    assert updating["config"]["served_entities"][0]["state"]["deployment"] == "DEPLOYMENT_READY"
    pending = updating["pending_config"]
    assert pending["config_version"] == 3 and pending["start_time"] == 1_700_000_000_500
    assert pending["served_entities"][0]["entity_version"] == "9"
    assert pending["served_entities"][0]["state"] == {
        "deployment": "DEPLOYMENT_CREATING",
        "deployment_state_message": "starting",
    }
    failed = endpoint_view(
        record(ready="NOT_READY", config_version=1, config_update="UPDATE_FAILED", state_message="replica exited")
    )
    assert failed["config"]["served_entities"][0]["state"]["deployment"] == "DEPLOYMENT_FAILED"
    creating = endpoint_view(record(ready="NOT_READY", config_update="IN_PROGRESS"))
    assert creating["config"]["served_entities"][0]["state"] == {"deployment": "DEPLOYMENT_CREATING"}


def test_view_parses_with_the_databricks_sdk() -> None:
    serving = pytest.importorskip("databricks.sdk.service.serving")
    new = normalize_config(EndpointCoreConfig.model_validate({"served_entities": [entity(entity_version="9")]}))
    view = endpoint_view(
        record(
            pending_config=new,
            config_update="IN_PROGRESS",
            ai_gateway={"usage_tracking_config": {"enabled": True}},
            tags=[{"key": "team", "value": "risk"}],
        )
    )
    parsed = serving.ServingEndpointDetailed.from_dict(json.loads(json.dumps(view)))
    assert parsed.name == "fraud" and parsed.creator == "alice"
    assert parsed.state.ready == serving.EndpointStateReady.READY
    assert parsed.state.config_update == serving.EndpointStateConfigUpdate.IN_PROGRESS
    assert parsed.config.config_version == 2
    assert [e.name for e in parsed.config.served_entities] == ["fraud_model-3", "challenger"]
    assert parsed.config.served_entities[0].entity_version == "3"
    assert parsed.config.served_entities[0].workload_type == serving.ServingModelWorkloadType.CPU
    assert parsed.config.served_entities[0].state.deployment == serving.ServedModelStateDeployment.DEPLOYMENT_READY
    assert parsed.config.served_models[1].model_version == "4"
    assert [(r.served_model_name, r.traffic_percentage) for r in parsed.config.traffic_config.routes] == [
        ("fraud_model-3", 90),
        ("challenger", 10),
    ]
    assert parsed.config.auto_capture_config.enabled is True
    assert parsed.pending_config.config_version == 3
    assert parsed.pending_config.served_entities[0].state.deployment == (
        serving.ServedModelStateDeployment.DEPLOYMENT_CREATING
    )
    assert parsed.ai_gateway.usage_tracking_config.enabled is True
    assert parsed.tags[0].key == "team"
    listed = serving.ListEndpointsResponse.from_dict({"endpoints": [view]})
    assert listed.endpoints[0].state.ready == serving.EndpointStateReady.READY


@pytest.mark.parametrize(
    "entity, field",
    [
        ({"autoscaling": {"min_target": -1}}, "autoscaling.min_target"),
        ({"autoscaling": {"nonsense": 1}}, "autoscaling.nonsense"),
        ({"autoscaling": {"vertical_metrics": ["latency", "vibes"]}}, "autoscaling.vertical_metrics"),
        ({"autoscaling": {"scale_down_window_s": 5}}, "autoscaling.scale_down_window_s"),
        ({"autoscaling": {"min_replicas": 2}}, "autoscaling.min_replicas"),
        ({"autoscaling": {"up_tolerance": 0.2}}, "autoscaling.up_tolerance: no longer a setting"),
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas"),
    ],
)
def test_an_invalid_scaling_config_is_refused_naming_the_field(entity, field):
    from serving.endpoints.spec import EndpointCoreConfig
    from serving.endpoints.validation import normalize_config
    from serving.protocol.errors import ApiError

    config = EndpointCoreConfig.model_validate(
        {"served_entities": [{"entity_name": "m", "entity_version": "1", **entity}]}
    )
    with pytest.raises(ApiError) as err:
        normalize_config(config, None)
    assert err.value.status_code == 400 and field in err.value.message


def test_the_scaling_config_follows_the_served_entity():
    from serving.endpoints.scaling import scaling_config
    from serving.endpoints.spec import ServedEntityInput

    fixed = scaling_config(ServedEntityInput(entity_name="m", entity_version="1", max_concurrency=30, max_replicas=8))
    assert not fixed.vertical and fixed.initial_target == 20 and fixed.max_replicas == 8 and fixed.min_replicas == 1
    zero = scaling_config(
        ServedEntityInput(
            entity_name="m", entity_version="1", scale_to_zero_enabled=True, autoscaling={"idle_window_s": 60}
        )
    )
    assert zero.scale_to_zero and zero.min_replicas == 0 and zero.idle_window_s == 60 and zero.vertical


def test_a_stored_config_with_a_removed_autoscaling_field_rolls_out_without_it():
    """Accepted before the field was removed: a restart must not refuse it (a new request naming it is a 400)."""
    from serving.endpoints.scaling import scaling_config
    from serving.endpoints.spec import ServedEntityInput

    entity = ServedEntityInput.model_validate(
        {
            "entity_name": "m",
            "entity_version": "1",
            "name": "m-1",
            "autoscaling": {"up_tolerance": 0.2, "idle_window_s": 60},
        }
    )
    assert scaling_config(entity, stored=True).idle_window_s == 60
    with pytest.raises(ValueError, match="up_tolerance"):
        scaling_config(entity)
