"""The console's routes, under ``/console/`` on the gateway's control-plane port (``serving.gateway.app`` hands
them every path there).

Authentication: ``POST /console/sign-in`` takes a token (the admin token or a scoped one of the tokens file) and
keeps it in a cookie that scripts cannot read (HttpOnly), that the browser sends to this gateway's ``/console/``
only and never from another site's page (SameSite=Strict). Every other route needs that cookie and shows only
the endpoints its token may access; without it a page redirects to the sign-in page and the JSON and event routes
answer 401. Changes (the traffic split) need the admin token and the ``X-Tollfree-Console`` header, which no
other site's form can send. Every answer carries a Content-Security-Policy that allows this origin's scripts and
styles only (``pages.CSP``).

Live: ``.../events`` routes are server-sent events: the endpoints' rows every 2 s, an endpoint's new points,
decisions and replicas every second. The history (the last hour) is the leading gateway's timeline
(``serving.console.timeline``), fed by its autoscaler's samples.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from serving.console import pages, views
from serving.console.timeline import Timeline
from serving.endpoints import spec
from serving.endpoints.monitoring_results import load_latest
from serving.endpoints.views import endpoint_view
from serving.protocol.errors import (
    ApiError,
    invalid_parameter,
    not_found,
    payload_too_large,
    permission_denied,
    unauthenticated,
)
from serving.registry.canary_store import read_state
from serving.replicas.local import LocalReplica

COOKIE = "tollfree_console"
CHANGE_HEADER = "x-tollfree-console"  # a header no cross-site form or simple request can carry
MAX_FORM_BYTES = 4096
STREAM_S = 600.0  # an event stream ends after this; the browser reconnects (and its cookie is checked again)
LOG_LINES = 20
LOG_EVERY = 5  # an endpoint's event stream sends the replicas' log tails every 5 s
HISTORY_S = 3600.0


class Console:
    """The console over the gateway's app state (``manager``, ``tokens``, the autoscaler once it runs) and its
    ``timeline``."""

    def __init__(self, state: Any, timeline: Timeline, clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.timeline = timeline
        self.clock = clock
        static = Path(__file__).resolve().parent / "static"
        self.app = Starlette(
            routes=[
                Route("/console", self.home),
                Route("/console/", self.home),
                Route("/console/sign-in", self.sign_in_page, methods=["GET"]),
                Route("/console/sign-in", self.sign_in, methods=["POST"]),
                Route("/console/sign-out", self.sign_out, methods=["POST"]),
                Route("/console/endpoints/{name}", self.endpoint_page),
                Route("/console/api/endpoints", self.overview),
                Route("/console/api/events", self.overview_events),
                Route("/console/api/endpoints/{name}", self.endpoint_snapshot),
                Route("/console/api/endpoints/{name}/events", self.endpoint_events),
                Route("/console/api/endpoints/{name}/traffic", self.set_traffic, methods=["POST"]),
                Mount("/console/static", StaticFiles(directory=static)),
            ]
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        async def secured(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"content-security-policy", pages.CSP.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"cache-control", b"no-store"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, secured)

    # ---- who is asking -------------------------------------------------------------------------------------

    def _principal(self, request: Request) -> Any | None:
        token = request.cookies.get(COOKIE)
        return self.state.tokens.lookup(token) if token else None

    def _may_see(self, request: Request, name: str) -> Any:
        """The principal, if it may see endpoint ``name``; an ApiError otherwise (nothing said of the endpoint)."""
        who = self._principal(request)
        if who is None:
            raise unauthenticated("sign in to the console first")
        if not who.can_access(name):
            raise not_found(f"no endpoint {name}")
        return who

    # ---- pages -----------------------------------------------------------------------------------------------

    async def home(self, request: Request) -> Response:
        who = self._principal(request)
        if who is None:
            return RedirectResponse("/console/sign-in", 303)
        return HTMLResponse(pages.endpoints(who.name))

    async def sign_in_page(self, request: Request) -> Response:
        return HTMLResponse(pages.sign_in())

    async def sign_in(self, request: Request) -> Response:
        declared = request.headers.get("content-length", "")
        if not declared.isdigit() or int(declared) > MAX_FORM_BYTES:
            return HTMLResponse(pages.sign_in("the sign-in form is too large"), 413)
        form = parse_qs((await request.body()).decode(errors="replace"))  # application/x-www-form-urlencoded
        token = (form.get("token") or [""])[0]
        if not token or self.state.tokens.lookup(token) is None:
            return HTMLResponse(pages.sign_in("that token is not one this gateway knows"), 401)
        answer = RedirectResponse("/console/", 303)
        secure = request.url.scheme == "https"
        answer.set_cookie(COOKIE, token, path="/console", httponly=True, samesite="strict", secure=secure)
        return answer

    async def sign_out(self, request: Request) -> Response:
        answer = RedirectResponse("/console/sign-in", 303)
        answer.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return answer

    async def endpoint_page(self, request: Request) -> Response:
        name = request.path_params["name"]
        who = self._principal(request)
        if who is None:
            return RedirectResponse("/console/sign-in", 303)
        if not who.can_access(name):
            return HTMLResponse(pages.sign_in(f"no endpoint {name} for this token"), 404)
        return HTMLResponse(pages.endpoint(who.name, name, who.admin))

    # ---- data ----------------------------------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        try:
            return JSONResponse({"endpoints": self._rows(request)})
        except ApiError as err:
            return _error(err)

    async def overview_events(self, request: Request) -> Response:
        try:
            self._rows(request)
        except ApiError as err:
            return _error(err)

        async def ticks() -> AsyncIterator[str]:
            yield "retry: 2000\n\n"
            ended = self.clock() + STREAM_S
            while self.clock() < ended and not await request.is_disconnected():
                rows = await run_in_threadpool(self._rows, request)
                yield _event("endpoints", {"endpoints": rows, "t": self.clock()})
                await asyncio.sleep(2.0)

        return _stream(ticks())

    def _rows(self, request: Request) -> list[dict[str, Any]]:
        who = self._principal(request)
        if who is None:
            raise unauthenticated("sign in to the console first")
        now = self.clock()
        rows = []
        for record in self.state.manager.endpoints.list():
            if who.can_access(record.name):
                points = self.timeline.last(record.name, views.WINDOW_S)
                rows.append(
                    views.overview_row(
                        endpoint_view(record),
                        points,
                        self._ready(record.name),
                        self._slo_ms(record.name),
                        self._canary(record.name),
                        self._monitoring(record.name),
                        now,
                    )
                )
        return rows

    async def endpoint_snapshot(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            self._may_see(request, name)
            snapshot = await run_in_threadpool(self._snapshot, name, self.clock() - HISTORY_S, 200)
            return JSONResponse(snapshot)
        except ApiError as err:
            return _error(err)

    async def endpoint_events(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            self._may_see(request, name)
            after = float(request.query_params.get("after", self.clock()))
        except ApiError as err:
            return _error(err)
        except ValueError:
            return _error(invalid_parameter("after must be a number of seconds"))

        async def ticks() -> AsyncIterator[str]:
            nonlocal after
            yield "retry: 2000\n\n"
            ended, tick = self.clock() + STREAM_S, 0
            while self.clock() < ended and not await request.is_disconnected():
                try:  # the replicas' log tails every LOG_EVERY ticks: files read, not needed each second
                    snapshot = await run_in_threadpool(self._snapshot, name, after, 50, tick % LOG_EVERY == 0)
                except ApiError:  # deleted meanwhile
                    yield _event("gone", {"endpoint": name})
                    return
                newest = [p["t"] for points in snapshot["points"].values() for p in points]
                after = max([after, *newest])
                yield _event("tick", snapshot)
                tick += 1
                await asyncio.sleep(1.0)

        return _stream(ticks())

    def _snapshot(self, name: str, after: float, decisions: int, logs: bool = True) -> dict[str, Any]:
        """The endpoint's page: its row, config, the points and decisions later than ``after``, its replicas (with
        their log tails when ``logs``) and its canary. Blocking (the store, the files): run it off the event loop."""
        record = self.state.manager.endpoints.get(name)  # ApiError 404 when gone
        view = endpoint_view(record)
        now = self.clock()
        points = self.timeline.since(name, after)
        recent = self.timeline.last(name, views.WINDOW_S)
        canary, monitoring = self._canary(name), self._monitoring(name)
        return {
            "t": now,
            "endpoint": views.overview_row(
                view, recent, self._ready(name), self._slo_ms(name), canary, monitoring, now
            ),
            "config": view.get("config"),
            "pending_config": view.get("pending_config"),
            "state_message": view.get("state_message"),
            "points": {entity: [p.as_dict() for p in ps] for entity, ps in points.items()},
            "decisions": self._decisions(name, after, decisions),
            "replicas": self._replicas(name, logs),
            "canary": views.canary_summary(canary),
            "monitoring": monitoring,
        }

    def _ready(self, name: str) -> dict[str, int]:
        live = self.state.manager.live.get(name)
        sets = live.replica_sets.items() if live is not None else ()
        return {entity: sum(r.alive() for r in s.replicas) for entity, s in sets}

    def _slo_ms(self, name: str) -> dict[str, float]:
        live = self.state.manager.live.get(name)
        sets = live.replica_sets.items() if live is not None else ()
        return {entity: s.scaling.latency_slo_ms for entity, s in sets if s.scaling is not None}

    def _canary(self, name: str) -> Mapping[str, Any] | None:
        return read_state(self.state.manager.home, name)

    def _monitoring(self, name: str) -> Mapping[str, Any] | None:
        return load_latest(self.state.manager.home, name)

    def _decisions(self, name: str, after: float, limit: int) -> list[dict[str, Any]]:
        """The autoscaler's decisions for the endpoint later than ``after`` (wall clock), newest last."""
        scaler = getattr(self.state, "autoscaler", None)
        if scaler is None:
            return []
        shift = time.time() - scaler.clock()  # its records carry its own (monotonic) clock
        return [{**d, "t": d["t"] + shift} for d in scaler.controller.since(name, after - shift, limit)]

    def _replicas(self, name: str, logs: bool) -> list[dict[str, Any]]:
        live = self.state.manager.live.get(name)
        out = []
        for entity, replica_set in live.replica_sets.items() if live is not None else ():
            for replica in replica_set.replicas:
                out.append(
                    {
                        "served_entity": entity,
                        "model_version": replica_set.version,
                        "pid": replica.pid,
                        "alive": replica.alive(),
                        "outstanding": replica.outstanding,
                        "log": _tail(replica.log_path) if logs and isinstance(replica, LocalReplica) else None,
                    }
                )
        return out

    # ---- the one change ------------------------------------------------------------------------------------

    async def set_traffic(self, request: Request) -> Response:
        """Set the traffic split: the stored config with new routes, through the same ``update_config`` as the
        API's ``PUT .../config`` (what the Databricks SDK's ``update_config`` sends)."""
        name = request.path_params["name"]
        try:
            who = self._may_see(request, name)
            if not who.admin:
                raise permission_denied("changing an endpoint needs the admin token")
            if request.headers.get(CHANGE_HEADER) != "1":
                raise permission_denied(f"a change from the console carries the header {CHANGE_HEADER}: 1")
            body = await request.body()
            if len(body) > MAX_FORM_BYTES:
                raise payload_too_large("the traffic split is too large")
            try:
                traffic = spec.TrafficConfig.model_validate_json(body)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(part) for part in first["loc"]) or "body"
                raise invalid_parameter(f"traffic split: {where}: {first['msg']}") from None
            record = self.state.manager.endpoints.get(name)
            config = record.config.model_copy(update={"traffic_config": traffic})
            updated = await self.state.manager.endpoints.update_config(name, config)
            return JSONResponse(endpoint_view(updated))
        except ApiError as err:
            return _error(err)


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse({"error_code": err.error_code, "message": err.message}, err.status_code, err.headers)


def _event(kind: str, data: Mapping[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, default=str)}\n\n"


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"x-accel-buffering": "no"})


def _tail(path: Path, lines: int = LOG_LINES, max_bytes: int = 16384) -> list[str]:
    """The last ``lines`` lines of a replica's log (its last ``max_bytes`` read, never the whole file)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            size = log.tell()
            log.seek(max(0, size - max_bytes))
            text = log.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
