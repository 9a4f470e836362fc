"""Databricks-style API errors shared by the gateway and the model replicas.

Every error leaves the process as ``{"error_code": ..., "message": ...}`` so that
Databricks SDK / MLflow deployment clients can parse it. Messages are built by our
own code and must never echo request payloads: they end up in client logs and
dashboards we do not control.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "x-request-id"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._\-]{1,128}$")
_MAX_VALIDATION_ERRORS = 5
_MAX_LOC_PART = 64
# Pydantic messages for these types come from user validators and may quote the input.
_OPAQUE_VALIDATION_TYPES = frozenset({"value_error", "assertion_error"})
_HTTP_ERROR_CODES: dict[int, str] = {
    400: "BAD_REQUEST",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "ENDPOINT_NOT_FOUND",
    409: "RESOURCE_CONFLICT",
    429: "REQUEST_LIMIT_EXCEEDED",
    500: "INTERNAL_ERROR",
    503: "TEMPORARILY_UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


class ApiError(Exception):
    """An error with a Databricks error code, safe to show to the caller as-is."""

    def __init__(
        self, status_code: int, error_code: str, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.error_code = error_code
        self.message = message
        self.headers: dict[str, str] = dict(headers or {})

    def __repr__(self) -> str:
        return f"ApiError({self.status_code}, {self.error_code!r}, {self.message!r})"


def invalid_parameter(message: str) -> ApiError:
    return ApiError(400, "INVALID_PARAMETER_VALUE", message)


def malformed_request(message: str) -> ApiError:
    return ApiError(400, "MALFORMED_REQUEST", message)


def conflict(message: str) -> ApiError:
    return ApiError(409, "RESOURCE_CONFLICT", message)


def not_found(message: str) -> ApiError:
    return ApiError(404, "RESOURCE_DOES_NOT_EXIST", message)


def already_exists(message: str) -> ApiError:
    return ApiError(409, "RESOURCE_ALREADY_EXISTS", message)


def unauthenticated(message: str) -> ApiError:
    # RFC 6750: a 401 tells the client which scheme to use.
    return ApiError(401, "UNAUTHENTICATED", message, {"WWW-Authenticate": "Bearer"})


def permission_denied(message: str) -> ApiError:
    return ApiError(403, "PERMISSION_DENIED", message)


def unsupported_media_type(message: str) -> ApiError:
    return ApiError(415, "BAD_REQUEST", message)


def payload_too_large(message: str) -> ApiError:
    return ApiError(413, "BAD_REQUEST", message)


def unavailable(message: str) -> ApiError:
    return ApiError(503, "TEMPORARILY_UNAVAILABLE", message)


def timeout(message: str) -> ApiError:
    return ApiError(504, "DEADLINE_EXCEEDED", message)


def internal(message: str) -> ApiError:
    return ApiError(500, "INTERNAL_ERROR", message)


def error_body(err: ApiError) -> dict[str, str]:
    """The JSON body Databricks clients expect for any non-2xx response."""
    return {"error_code": err.error_code, "message": err.message}


def resolve_request_id(header_value: str | None) -> str:
    """Reuse the caller's request id if it is a plain token, else mint one.

    The id is echoed in responses and logs, so arbitrary header content
    (newlines, huge strings) is replaced rather than trusted.
    """
    if header_value and _REQUEST_ID_RE.match(header_value):
        return header_value
    return uuid.uuid4().hex


def _format_loc(loc: Sequence[Any]) -> str:
    parts = list(loc)
    if parts and parts[0] == "body":
        parts = parts[1:]
    if not parts:
        return "request body"
    out = ""
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            # Dict keys in a location come from the payload: bound their size.
            text = str(part)[:_MAX_LOC_PART]
            out += f".{text}" if out else text
    return out


def _validation_message(error: Mapping[str, Any]) -> str:
    err_type = str(error.get("type", ""))
    if err_type == "json_invalid":
        return "request body is not valid JSON"
    msg = str(error.get("msg") or "invalid value")
    if err_type in _OPAQUE_VALIDATION_TYPES:
        msg = "invalid value"
    value = error.get("input")
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value)
        if len(text) >= 3 and text in msg:
            msg = "invalid value"
    msg = msg[:1].lower() + msg[1:]
    return f"{_format_loc(error.get('loc', ()))}: {msg}"


def validation_error_message(errors: Sequence[Mapping[str, Any]]) -> str:
    """Summarise pydantic errors by location and kind, never by input value."""
    if not errors:
        return "invalid request"
    shown = [_validation_message(e) for e in errors[:_MAX_VALIDATION_ERRORS]]
    text = "; ".join(shown)
    extra = len(errors) - len(shown)
    if extra > 0:
        text += f" (and {extra} more)"
    return text


async def _api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return JSONResponse(error_body(exc), status_code=exc.status_code, headers=exc.headers or None)


async def _validation_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    err = invalid_parameter(validation_error_message(exc.errors()))
    return JSONResponse(error_body(err), status_code=err.status_code)


async def _http_exception_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    default = "INTERNAL_ERROR" if exc.status_code >= 500 else "BAD_REQUEST"
    code = _HTTP_ERROR_CODES.get(exc.status_code, default)
    if isinstance(exc.detail, str) and exc.detail:
        message = exc.detail
    else:
        try:
            message = HTTPStatus(exc.status_code).phrase
        except ValueError:
            message = "request failed"
    err = ApiError(exc.status_code, code, message)
    return JSONResponse(error_body(err), status_code=err.status_code, headers=headers)


async def _unhandled_exception_handler(request: Request, exc: Exception) -> Response:
    request_id = resolve_request_id(request.headers.get(REQUEST_ID_HEADER))
    # Only method, route path and id: body and headers may carry secrets or PII.
    logger.exception("unhandled error request_id=%s method=%s path=%s", request_id, request.method, request.url.path)
    err = internal(f"internal error; request id {request_id}")
    return JSONResponse(error_body(err), status_code=err.status_code, headers={REQUEST_ID_HEADER: request_id})


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure path of ``app`` answer in the Databricks error shape.

    Note: Starlette re-raises unhandled exceptions after the 500 is sent so the
    ASGI server can log them too; use ``TestClient(app, raise_server_exceptions=False)``.
    """
    app.add_exception_handler(ApiError, _api_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, _http_exception_handler)
    app.add_exception_handler(Exception, _unhandled_exception_handler)
