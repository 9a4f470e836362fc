"""The OpenAPI document of one endpoint's invocations route, from what its served models accept
(``serving.endpoints.model_io``: a FeatureService's entity keys and request-time fields, else the signature's
input columns).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.model_io import model_io
from serving.endpoints.store import EndpointStore
from serving.protocol.tensors import DATATYPES

_JSON_TYPES = {
    "long": "integer",
    "integer": "integer",
    "double": "number",
    "float": "number",
    "boolean": "boolean",
    "string": "string",
    "datetime": "string",
    "binary": "string",
    "int64": "integer",
    "int32": "integer",
    "float64": "number",
    "float32": "number",
    "bool": "boolean",
}


def model_inputs(model_uri: str, home: Path) -> dict[str, str]:
    """Column -> JSON type that a request to this model carries."""
    return {c.name: _JSON_TYPES.get(c.type, "string") for c in model_io(model_uri, home).inputs}


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
            },
            **_oip_paths(endpoint, list(columns), responses),
        },
    }


def _oip_paths(endpoint: str, columns: list[str], responses: dict[str, Any]) -> dict[str, Any]:
    """The Open Inference Protocol's routes of the endpoint (``serving.gateway.oip_plane``): its metadata, its
    readiness and inference (by the split, or pinned to a version); errors there are ``{"error"}``."""
    tensor = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "enum": columns} if columns else {"type": "string"},
            "datatype": {"type": "string", "enum": list(DATATYPES)},
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "data": {"type": "array"},
            "parameters": {"type": "object", "properties": {"binary_data_size": {"type": "integer"}}},
        },
        "required": ["name", "datatype", "shape"],
    }
    infer = {
        "type": "object",
        "properties": {
            "id": {"type": "string"},
            "inputs": {"type": "array", "items": tensor, "minItems": 1},
            "outputs": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}},
            "parameters": {"type": "object", "properties": {"binary_data_output": {"type": "boolean"}}},
        },
        "required": ["inputs"],
    }
    error = {"type": "object", "properties": {"error": {"type": "string"}}}
    oip_responses = {
        **{code: {**answer, "content": {"application/json": {"schema": error}}} for code, answer in responses.items()},
        "200": {"description": "Output tensors: model_name, model_version, id, outputs (name, datatype, shape, data)."},
    }
    version = {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
    paths: dict[str, Any] = {}
    for base, parameters in (
        (f"/v2/models/{endpoint}", []),
        (f"/v2/models/{endpoint}/versions/{{version}}", [version]),
    ):
        paths[base] = {"get": {"parameters": parameters, "responses": {"200": {"description": "Model metadata."}}}}
        paths[base + "/ready"] = {
            "get": {
                "parameters": parameters,
                "responses": {"200": {"description": "Ready."}, "400": {"description": "Not ready."}},
            }
        }
        paths[base + "/infer"] = {
            "post": {
                "parameters": parameters,
                "requestBody": {"required": True, "content": {"application/json": {"schema": infer}}},
                "responses": oip_responses,
            }
        }
    return paths


async def endpoint_document(store: EndpointStore, name: str, home: Path) -> dict[str, Any]:
    """The OpenAPI document of endpoint ``name``, from the models its current config serves."""
    record = await run_in_threadpool(store.get, name)
    inputs = {}
    for served_entity in spec.registry_entities(record.config):
        uri = f"models:/{served_entity.entity_name}/{served_entity.resolved_version}"
        inputs[str(served_entity.name)] = await run_in_threadpool(model_inputs, uri, home)
    return endpoint_openapi(name, inputs)
