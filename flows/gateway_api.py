"""The gateway's control plane as the flows drive it: over HTTP, like any client.

``GatewayApi`` reads an endpoint, writes a config (served entities and traffic routes) and waits for
the rollout to settle; the canary's moves (``serving.registry.canary``) drive an endpoint through it.
The gateway's URL is ``serving.discovery``'s: a ``gateway_url`` given, else ``TOLLFREE_GATEWAY_URL``, else the
URL a live gateway recorded in the state folder, else ``http://127.0.0.1:8080``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from serving.discovery import GatewayAddress, resolve_gateway

TOKEN_ENV = "TOLLFREE_TOKEN"
API = "/api/2.0/serving-endpoints"


class GatewayError(RuntimeError):
    """The gateway could not be reached, or answered ``status`` (None when it did not answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GatewayApi:
    def __init__(
        self,
        url: str,
        token: str,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = 30.0,
        address: GatewayAddress | None = None,
    ) -> None:
        self._client = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout_s, transport=transport
        )
        self.url = url
        self.address = address or GatewayAddress(url, "given", "GatewayApi's url")  # named when it cannot connect

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ, url: str | None = None) -> GatewayApi:
        """A client of the gateway at ``url``, else at the URL ``serving.discovery`` resolves from ``environ``."""
        token = environ.get(TOKEN_ENV)
        if not token:
            raise GatewayError(f"{TOKEN_ENV} is not set: the flows need the gateway's admin token")
        try:
            address = resolve_gateway(environ, url, "the gateway_url parameter")
        except ValueError as exc:
            raise GatewayError(str(exc)) from None
        return cls(address.url, token, address=address)

    def close(self) -> None:
        self._client.close()

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        try:
            reply = self._client.request(method, path, json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise GatewayError(self.address.unreachable(type(exc).__name__)) from exc
        except httpx.TransportError as exc:
            raise GatewayError(f"gateway at {self.url}: {method} {path} failed ({type(exc).__name__})") from exc
        if reply.status_code != 200:
            try:
                message = reply.json().get("message", "")
            except ValueError:
                message = reply.text[:200]
            raise GatewayError(f"{method} {path}: {reply.status_code} {message}", reply.status_code)
        return reply.json()

    def get(self, endpoint: str) -> dict[str, Any]:
        return self._call("GET", f"{API}/{endpoint}")

    def find(self, endpoint: str) -> dict[str, Any] | None:
        """The endpoint's view, None when the gateway has no such endpoint."""
        try:
            return self.get(endpoint)
        except GatewayError as exc:
            if exc.status == 404:
                return None
            raise

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create an endpoint (the create request's JSON); its view."""
        return self._call("POST", API, body)

    def put_ai_gateway(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"{API}/{endpoint}/ai-gateway", body)

    def names(self) -> list[str]:
        """Every endpoint the gateway serves."""
        return [e["name"] for e in self._call("GET", API).get("endpoints", [])]

    def replicas(self, endpoint: str) -> list[dict[str, Any]]:
        """The endpoint's replica processes as the gateway sees them (served entity, version, pid, rss_mb)."""
        return list(self._call("GET", f"{API}/{endpoint}/replicas").get("replicas", []))

    def put_config(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("PUT", f"{API}/{endpoint}/config", body)

    def wait_settled(self, endpoint: str, timeout_s: float = 300.0, poll_s: float = 0.3) -> dict[str, Any]:
        """The endpoint's view once no config update is in progress (NOT_UPDATING or UPDATE_FAILED)."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self.get(endpoint)
            if view["state"]["config_update"] != "IN_PROGRESS":
                return view
            if time.monotonic() > deadline:
                raise GatewayError(f"endpoint {endpoint}: config update still in progress after {timeout_s:.0f} s")
            time.sleep(poll_s)

    def apply(self, endpoint: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """PUT a config and wait for it to settle; the settled view."""
        self.put_config(endpoint, body)
        return self.wait_settled(endpoint, timeout_s)
