"""The Open Inference Protocol's gRPC service (``inference.GRPCInferenceService``) on a port of its own, beside the
HTTP server on the same event loop.

Each method is the REST route's (``serving.gateway.oip_plane.OipPlane``): the same token rights and rate limit
(the bearer token comes in the ``authorization`` metadata), and an inference takes the same admission, split, cache,
dispatcher and inference log. An error ends the call with the gRPC status of the REST route's HTTP status and its
message; a refusal for load carries ``retry-after`` in the trailing metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from serving.gateway.oip_plane import OipPlane
from serving.protocol import oip_grpc
from serving.protocol.errors import REQUEST_ID_HEADER, ApiError, resolve_request_id
from serving.protocol.oip import InferRequest
from serving.protocol.v2 import grpc_predict_v2_pb2 as pb
from serving.protocol.v2 import grpc_predict_v2_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
T = TypeVar("T")

# the gRPC status of each HTTP status the routes answer with
STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
GRACE_S = 5.0  # seconds calls in flight get to finish when the gateway stops


class OipService(pb_grpc.GRPCInferenceServiceServicer):
    """The service's six methods over ``plane``."""

    def __init__(self, plane: OipPlane) -> None:
        self.plane = plane

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Any) -> pb.ServerLiveResponse:
        return await self._answer(context, None, lambda: _now(pb.ServerLiveResponse(live=True)))

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Any) -> pb.ServerReadyResponse:
        return await self._answer(context, None, lambda: _now(pb.ServerReadyResponse(ready=True)))

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Any) -> pb.ServerMetadataResponse:
        return await self._answer(
            context, None, lambda: _now(pb.ServerMetadataResponse(**self.plane.server_metadata()))
        )

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Any) -> pb.ModelReadyResponse:
        async def ready() -> pb.ModelReadyResponse:
            return pb.ModelReadyResponse(ready=await self.plane.model_ready(request.name, request.version or None))

        return await self._answer(context, request.name, ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Any) -> pb.ModelMetadataResponse:
        async def metadata() -> pb.ModelMetadataResponse:
            doc = await self.plane.model_metadata(request.name, request.version or None)
            return oip_grpc.model_metadata(doc)

        return await self._answer(context, request.name, metadata)

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Any) -> pb.ModelInferResponse:
        metadata = _metadata(context)
        request_id = resolve_request_id(metadata.get(REQUEST_ID_HEADER))
        authorization = metadata.get("authorization", "").encode("latin-1", "replace")

        async def read() -> InferRequest:
            return oip_grpc.request_from_message(request)

        context.set_trailing_metadata(((REQUEST_ID_HEADER, request_id),))  # with the answer: no frame of its own
        name = request.model_name
        done = await self.plane.infer(
            {b"authorization": authorization}, name, request.model_version or None, request_id, read
        )
        if done.outputs is None or done.request is None:
            headers = {k.decode(): v.decode("latin-1") for k, v in done.reply.headers if k == b"retry-after"}
            await _abort(context, done.reply.status, done.message or "the model failed", headers)
        response = oip_grpc.infer_response(done.outputs, done.request, name, done.reply.version)
        self.plane.mirror(done)  # its tasks run once this handler has returned the answer
        return response

    async def _answer(self, context: Any, name: str | None, answer: Callable[[], Awaitable[T]]) -> T:
        """``answer()`` for a caller with a token (with a right to endpoint ``name`` when one is named) within its
        rate limit; an ApiError ends the call with its status."""
        try:
            self.plane.caller(_metadata(context).get("authorization"), name)
            return await answer()
        except ApiError as err:
            await _abort(context, err.status_code, err.message, err.headers)


async def _now(value: T) -> T:
    return value


def _metadata(context: Any) -> dict[str, str]:
    """The call's metadata, by key (the first value of each)."""
    found: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key not in found:
            found[key] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return found


async def _abort(context: Any, status: int, message: str, headers: dict[str, str] | None = None) -> NoReturn:
    """End the call with the gRPC status of HTTP ``status``."""
    if headers:
        extra = tuple((key.lower(), value) for key, value in headers.items())  # gRPC keys are lower case
        context.set_trailing_metadata(tuple(context.trailing_metadata() or ()) + extra)
    await context.abort(STATUS.get(status, grpc.StatusCode.UNKNOWN), message)
    raise AssertionError("grpc's abort returned")  # it raises to end the call


class GrpcListen:
    """The service on ``host:port`` (0: a free port, then ``port`` is the one it got) while the gateway runs, on
    its event loop. ``bind`` takes the port (first, so a port in use stops the gateway before it starts anything),
    ``start`` serves on it once the endpoints are restored. No other process may share the port (SO_REUSEPORT is
    off)."""

    def __init__(self, plane: OipPlane, host: str, port: int, max_message_bytes: int) -> None:
        self.plane, self.host, self.port, self.max_message_bytes = plane, host, port, max_message_bytes
        self.server: grpc.aio.Server | None = None
        self._bound: grpc.aio.Server | None = None

    def bind(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
            ]
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(OipService(self.plane), server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        try:
            self.port = server.add_insecure_port(f"{host}:{self.port}")
        except RuntimeError:
            raise OSError(f"the gRPC port {host}:{self.port} is in use or not an address of this machine") from None
        self._bound = server

    async def start(self) -> None:
        if self._bound is None:
            self.bind()
        assert self._bound is not None
        await self._bound.start()
        self.server, self._bound = self._bound, None
        log.info("Open Inference Protocol over gRPC on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(GRACE_S)
            self.server = None
