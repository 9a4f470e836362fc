"""The device's local scoring server: the MLflow scoring protocol on ``POST /invocations``.

- ``GET /ping`` and ``GET /health``: 200 while a model is loaded, else 503 (no token: probes);
- ``GET /version``: the bundle served (model, version);
- ``POST /invocations``: a JSON body of the scoring protocol (``scoring``), answered ``{"predictions": [...]}``.

Every route but the probes needs ``Authorization: Bearer TOKEN``. Errors are ``{"error_code", "message"}`` as
MLflow's scoring server answers them, and name the field, never a value of the request.

``swap`` replaces the model between two requests: a request reads the model once, so one that started on the old
model finishes on it, and none is dropped or refused while the swap happens. Each answered request is kept as an
inference record (``telemetry``) with its bundle's version, but for the agent's own probes (``PROBE_HEADER``).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tollfree_edge.model import EdgeModel
from tollfree_edge.scoring import ScoringError, read_rows
from tollfree_edge.telemetry import Telemetry

MAX_BODY = 16 << 20
PROBE_HEADER = "x-tollfree-probe"  # the agent's own health probe: answered, not kept as an inference record


class EdgeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], token: str, telemetry: Telemetry | None = None) -> None:
        super().__init__(address, _Handler)
        self.token = token
        self.telemetry = telemetry
        self.model: EdgeModel | None = None
        self._swap = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def swap(self, model: EdgeModel | None) -> EdgeModel | None:
        """Serve ``model`` from the next request on; the model served until now."""
        with self._swap:
            old, self.model = self.model, model
        return old


class _Handler(BaseHTTPRequestHandler):
    server: EdgeServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: without it the body waits for an ACK

    def log_message(self, format: str, *args: Any) -> None:  # the access log stays off: bodies are data
        pass

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"error_code": code, "message": message})

    def _authorized(self) -> bool:
        given = self.headers.get("authorization", "")
        if given.startswith("Bearer ") and hmac.compare_digest(given[7:].encode(), self.server.token.encode()):
            return True
        self._error(401, "UNAUTHENTICATED", "a bearer token is required")
        return False

    def do_GET(self) -> None:
        model = self.server.model
        if self.path in ("/ping", "/health"):
            self._send(200 if model else 503, {"status": "ready" if model else "no bundle loaded"})
        elif self.path == "/version":
            if self._authorized():
                self._send(200, {"model": model.manifest.model, "version": model.version} if model else {})
        else:
            self._error(404, "ENDPOINT_NOT_FOUND", "no such route")

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            self.close_connection = True
            self._error(413, "BAD_REQUEST", f"the body is over {MAX_BODY} bytes")
            return
        body = self.rfile.read(length)
        if self.path != "/invocations":
            self._error(404, "ENDPOINT_NOT_FOUND", "no such route")
            return
        if not self._authorized():
            return
        if not self.headers.get("content-type", "").startswith("application/json"):
            self._error(415, "BAD_REQUEST", "content-type must be application/json")
            return
        model = self.server.model  # read once: a swap now leaves this request on the model it started with
        if model is None:
            self._error(503, "NOT_READY", "no bundle is loaded")
            return
        started = time.perf_counter()
        try:
            rows = read_rows(body, model.manifest.inputs)
        except ScoringError as exc:
            self._error(400, "BAD_REQUEST", str(exc))
            return
        out = model.predict(rows)
        self._send(200, {"predictions": out.tolist()})
        if self.server.telemetry is not None and PROBE_HEADER not in self.headers:
            self.server.telemetry.record(
                {
                    "request_id": str(uuid.uuid4()),
                    "timestamp": time.time(),
                    "model": model.manifest.model,
                    "version": model.version,
                    "inputs": dict(zip(model.manifest.inputs, rows.T.tolist())),
                    "outputs": out.tolist(),
                    "latency_ms": round((time.perf_counter() - started) * 1000, 3),
                    "status": 200,
                }
            )
