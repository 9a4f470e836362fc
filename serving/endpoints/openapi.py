"""The OpenAPI document of one endpoint's invocations route, from what its served models accept.

A model trained on a FeatureService accepts the service's entity keys and request-time fields (the
replica fetches the rest online); any other model accepts its signature's input columns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.store import EndpointStore

_JSON_TYPES = {
    "long": "integer",
    "integer": "integer",
    "double": "number",
    "float": "number",
    "boolean": "boolean",
    "string": "string",
    "datetime": "string",
    "binary": "string",
    "Int64": "integer",
    "Int32": "integer",
    "Float64": "number",
    "Float32": "number",
    "String": "string",
    "Bool": "boolean",
}


def model_inputs(model_uri: str, home: Path) -> dict[str, str]:
    """Column -> JSON type that a request to this model carries."""
    import mlflow.models

    info = mlflow.models.get_model_info(model_uri)
    service = (info.metadata or {}).get("feature_service")
    if service:
        from feature_repo import store as feature_store

        store = feature_store.open_store(home)
        fs = feature_store.feature_service(store, service)
        columns = dict.fromkeys(feature_store.entity_join_keys(store, fs), "integer")
        columns.update({k: _JSON_TYPES.get(t, "number") for k, t in feature_store.request_fields(store, fs).items()})
        return columns
    if info.signature is None or not info.signature.inputs.has_input_names():
        return {}
    return {
        column.name: _JSON_TYPES.get(str(getattr(column.type, "name", column.type)), "string")
        for column in info.signature.inputs.inputs
    }


def endpoint_openapi(endpoint: str, entities: dict[str, dict[str, str]]) -> dict[str, Any]:
    """OpenAPI 3.1 for ``POST /serving-endpoints/{endpoint}/invocations`` given served entity -> inputs."""
    columns: dict[str, str] = {}
    for inputs in entities.values():
        columns.update(inputs)
    record = {"type": "object", "properties": {c: {"type": t} for c, t in columns.items()}, "required": list(columns)}
    request = {
        "type": "object",
        "description": "One of the MLflow scoring protocol's input keys, optionally with params.",
        "properties": {
            "dataframe_records": {"type": "array", "items": record},
            "dataframe_split": {
                "type": "object",
                "properties": {
                    "columns": {"type": "array", "items": {"type": "string", "enum": list(columns)}},
                    "data": {"type": "array", "items": {"type": "array"}},
                },
                "required": ["columns", "data"],
            },
            "instances": {"type": "array", "items": record},
            "inputs": {
                "type": "object",
                "properties": {c: {"type": "array", "items": {"type": t}} for c, t in columns.items()},
            },
            "params": {"type": "object"},
        },
    }
    error = {"type": "object", "properties": {"error_code": {"type": "string"}, "message": {"type": "string"}}}
    responses = {
        "200": {
            "description": "Predictions; header served-model-name names the served entity.",
            "content": {"application/json": {"schema": {"type": "object", "properties": {"predictions": {}}}}},
        },
        **{
            code: {"description": text, "content": {"application/json": {"schema": error}}}
            for code, text in (
                ("400", "Malformed input or a schema mismatch, naming the column"),
                ("401", "Missing or invalid token"),
                ("403", "Token without rights on this endpoint"),
                ("404", "Unknown endpoint or entity"),
                ("413", "Body over the size limit"),
                ("415", "Unsupported content type"),
                ("429", "At capacity; see Retry-After"),
                ("500", "The model failed"),
                ("503", "Not ready"),
                ("504", "Timed out"),
            )
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"{endpoint} serving endpoint",
            "version": "1",
            "description": "Served entities: " + ", ".join(sorted(entities)),
        },
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{"bearer": []}],
        "paths": {
            f"/serving-endpoints/{endpoint}/invocations": {
                "post": {
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {"schema": request},
                            "text/csv": {"schema": {"type": "string"}},
                        },
                    },
                    "responses": responses,
                }
            }
        },
    }


async def endpoint_document(store: EndpointStore, name: str, home: Path) -> dict[str, Any]:
    """The OpenAPI document of endpoint ``name``, from the models its current config serves."""
    record = await run_in_threadpool(store.get, name)
    inputs = {}
    for served_entity in spec.registry_entities(record.config):
        uri = f"models:/{served_entity.entity_name}/{served_entity.resolved_version}"
        inputs[str(served_entity.name)] = await run_in_threadpool(model_inputs, uri, home)
    return endpoint_openapi(name, inputs)
