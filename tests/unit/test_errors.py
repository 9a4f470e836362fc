from __future__ import annotations

import logging

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, field_validator

from serving.protocol import errors
from serving.protocol.errors import ApiError, error_body, install_error_handlers

SECRET = "SECRET-VALUE-123"


class Entity(BaseModel):
    entity_name: str
    workload_size: int = 1


class Config(BaseModel):
    served_entities: list[Entity]


class CreateEndpoint(BaseModel):
    name: str
    config: Config

    @field_validator("name")
    @classmethod
    def _name_ok(cls, value: str) -> str:
        if not value.isidentifier():
            raise ValueError(f"bad name {value}")
        return value


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/endpoints")
    def create(body: CreateEndpoint) -> dict[str, str]:
        return {"name": body.name}

    @app.get("/missing")
    def missing() -> None:
        raise errors.not_found("serving endpoint 'x' does not exist")

    @app.post("/boom")
    async def boom(payload: dict) -> None:
        raise RuntimeError("model crashed")

    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(_app(), raise_server_exceptions=False)


@pytest.mark.parametrize(
    ("factory", "status", "code"),
    [
        (errors.invalid_parameter, 400, "INVALID_PARAMETER_VALUE"),
        (errors.malformed_request, 400, "MALFORMED_REQUEST"),
        (errors.not_found, 404, "RESOURCE_DOES_NOT_EXIST"),
        (errors.already_exists, 409, "RESOURCE_ALREADY_EXISTS"),
        (errors.unauthenticated, 401, "UNAUTHENTICATED"),
        (errors.permission_denied, 403, "PERMISSION_DENIED"),
        (errors.unsupported_media_type, 415, "BAD_REQUEST"),
        (errors.payload_too_large, 413, "BAD_REQUEST"),
        (errors.unavailable, 503, "TEMPORARILY_UNAVAILABLE"),
        (errors.timeout, 504, "DEADLINE_EXCEEDED"),
        (errors.internal, 500, "INTERNAL_ERROR"),
    ],
)
def test_helpers_set_status_and_code(factory, status: int, code: str) -> None:
    err = factory("something went wrong")
    assert isinstance(err, ApiError)
    assert (err.status_code, err.error_code, err.message) == (status, code, "something went wrong")
    assert error_body(err) == {"error_code": code, "message": "something went wrong"}


def test_unauthenticated_advertises_bearer_scheme() -> None:
    assert errors.unauthenticated("no").headers == {"WWW-Authenticate": "Bearer"}


def test_api_error_handler(client: TestClient) -> None:
    resp = client.get("/missing")
    assert resp.status_code == 404
    assert resp.json() == {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "serving endpoint 'x' does not exist"}


def test_validation_error_names_field_without_echoing_input(client: TestClient) -> None:
    body = {"name": "ok", "config": {"served_entities": [{"workload_size": SECRET}]}}
    resp = client.post("/endpoints", json=body)
    assert resp.status_code == 400
    data = resp.json()
    assert data["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "config.served_entities[0].entity_name: field required" in data["message"]
    assert "config.served_entities[0].workload_size" in data["message"]
    assert SECRET not in resp.text


def test_custom_validator_message_is_not_echoed(client: TestClient) -> None:
    resp = client.post("/endpoints", json={"name": SECRET, "config": {"served_entities": []}})
    assert resp.status_code == 400
    assert resp.json()["message"].startswith("name: ")
    assert SECRET not in resp.text


def test_invalid_json_body_is_a_400(client: TestClient) -> None:
    resp = client.post(
        "/endpoints", content=b'{"name": "' + SECRET.encode() + b'",', headers={"content-type": "application/json"}
    )
    assert resp.status_code == 400
    assert resp.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert SECRET not in resp.text


def test_unknown_route_and_method(client: TestClient) -> None:
    resp = client.get("/nope")
    assert resp.status_code == 404
    assert resp.json()["error_code"] == "ENDPOINT_NOT_FOUND"
    assert set(resp.json()) == {"error_code", "message"}
    resp = client.get("/endpoints")
    assert resp.status_code == 405
    assert set(resp.json()) == {"error_code", "message"}
    assert "POST" in resp.headers["allow"]


def test_unhandled_exception_is_generic_500_with_request_id(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    resp = client.post(
        "/boom", json={"features": SECRET}, headers={"x-request-id": "req-42", "authorization": f"Bearer {SECRET}"}
    )
    assert resp.status_code == 500
    data = resp.json()
    assert data["error_code"] == "INTERNAL_ERROR"
    assert "req-42" in data["message"]
    assert "model crashed" not in data["message"]
    assert resp.headers["x-request-id"] == "req-42"
    records = [r for r in caplog.records if r.name == "serving.protocol.errors"]
    assert records and records[0].exc_info is not None
    assert "req-42" in records[0].getMessage()
    assert SECRET not in caplog.text


def test_unhandled_exception_generates_request_id(client: TestClient) -> None:
    resp = client.post("/boom", json={}, headers={"x-request-id": "bad\nid " + "x" * 300})
    assert resp.status_code == 500
    rid = resp.headers["x-request-id"]
    assert len(rid) == 32 and int(rid, 16) >= 0
    assert rid in resp.json()["message"]


def test_resolve_request_id() -> None:
    assert errors.resolve_request_id("abc-123") == "abc-123"
    assert errors.resolve_request_id(None) != errors.resolve_request_id(None)
    assert len(errors.resolve_request_id("x" * 500)) == 32


def test_validation_error_message_limits_count() -> None:
    errs = [{"loc": ("body", f"f{i}"), "msg": "Field required", "type": "missing"} for i in range(8)]
    msg = errors.validation_error_message(errs)
    assert "f4: field required" in msg
    assert "f5" not in msg
    assert "(and 3 more)" in msg
