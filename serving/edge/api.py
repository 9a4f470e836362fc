"""The gateway's edge routes, under ``/api/2.0/edge``.

Operators (an admin token):

- ``POST /devices`` ``{"device", "group"}``: registers a device; the answer carries its token, shown this once;
- ``GET /devices[?group=G]``: each device's group, last report (version, previous, rejected versions, telemetry
  counters) and when it was last seen;
- ``POST /rollouts`` ``{"group", "model", "version" | "alias", "stages", "abort": {"failure_share",
  "min_devices"}, "offline_after_s"}``: a staged rollout of the version's bundle (it must have one);
- ``GET /rollouts/ID``: its state, stage, reason, and each device's stage and outcome;
  ``POST /rollouts/ID/abort``;
- ``GET /bundles/MODEL/VERSION``: a version's bundle file.

Devices (their own token, for their own id only; devices pull, so one behind NAT needs no inbound port):

- ``GET /devices/ID/desired``: the bundle to serve (``{"model", "version", "bundle"}``, or a null version);
- ``GET /devices/ID/bundles/MODEL/VERSION``: the bundle file (only the versions its group's rollout names);
- ``POST /devices/ID/status``: its report, which also moves the group's rollout on;
- ``POST /devices/ID/telemetry`` ``{"stream", "records"}``: inference records answered on the device, written to
  the inference log under the endpoint ``edge:GROUP`` with the device's id; records taken before are skipped.

Errors are the gateway's (``{"error_code", "message"}``), naming the field, never echoing a value.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route, Router

from serving.edge.bundle_files import BundleFiles, NoBundle
from serving.edge.fleet import Fleet, Rollout
from serving.edge.rollouts import RolloutConfigError, RolloutPolicy
from serving.inference_log import InferenceLogWriter, InferenceRecord
from serving.protocol.errors import (
    ApiError,
    error_body,
    invalid_parameter,
    malformed_request,
    not_found,
    permission_denied,
    unauthenticated,
)

PREFIX = "/api/2.0/edge"
ENDPOINT_PREFIX = "edge:"  # the inference log's endpoint for a device group's records
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_RECORDS = 5000  # per telemetry upload


# (method, path under PREFIX, handler, who may call it, what it does): the router's table and the HTTP API reference's
ROUTES = (
    ("POST", "/devices", "_devices", "admin token", "register a device in a group; its token, shown once"),
    ("GET", "/devices", "_devices", "admin token", "every device (`?group=G`: of one group) with its last report"),
    ("GET", "/devices/{device}/desired", "_desired", "the device's token", "the bundle the device should serve"),
    (
        "POST",
        "/devices/{device}/status",
        "_status",
        "the device's token",
        "the device's report; moves its group's rollout on",
    ),
    (
        "POST",
        "/devices/{device}/telemetry",
        "_telemetry",
        "the device's token",
        "inference records into the inference log",
    ),
    (
        "GET",
        "/devices/{device}/bundles/{model}/{version}",
        "_bundle",
        "the device's token",
        "a bundle of its group's rollout",
    ),
    ("GET", "/bundles/{model}/{version}", "_bundle", "admin token", "a version's bundle file"),
    ("POST", "/rollouts", "_start", "admin token", "a staged rollout of a version's bundle to a group"),
    ("GET", "/rollouts/{rollout}", "_rollout", "admin token", "a rollout's state and each device's stage and outcome"),
    ("POST", "/rollouts/{rollout}/abort", "_abort", "admin token", "abort a running rollout"),
)


def log_endpoint(group: str) -> str:
    return f"{ENDPOINT_PREFIX}{group}"


def _name(doc: dict[str, Any], field: str) -> str:
    value = doc.get(field)
    if not isinstance(value, str) or not NAME.match(value):
        raise invalid_parameter(f"{field}: a name of letters, digits, '_', '.' and '-' (at most 63), required")
    return value


async def _json(request: Request) -> dict[str, Any]:
    try:
        doc = json.loads(await request.body())
    except ValueError:
        raise malformed_request("the body is not JSON") from None
    if not isinstance(doc, dict):
        raise malformed_request("the body must be a JSON object")
    return doc


def _policy(doc: dict[str, Any]) -> RolloutPolicy:
    abort = doc.get("abort") or {}
    if not isinstance(abort, dict):
        raise invalid_parameter("abort: an object with failure_share and min_devices")
    unknown = sorted(set(abort) - {"failure_share", "min_devices"})
    if unknown:
        raise invalid_parameter(f"abort: unknown field(s) {unknown}")
    defaults = RolloutPolicy()
    try:
        stages = tuple(float(s) for s in doc.get("stages", defaults.stages))
        failure_share = float(abort.get("failure_share", defaults.failure_share))
        min_devices = int(abort.get("min_devices", defaults.min_devices))
        offline_after_s = float(doc.get("offline_after_s", defaults.offline_after_s))
    except (TypeError, ValueError):
        raise invalid_parameter("stages, abort.failure_share, abort.min_devices, offline_after_s: numbers") from None
    try:
        return RolloutPolicy(stages, failure_share, min_devices, offline_after_s)
    except RolloutConfigError as exc:
        raise invalid_parameter(str(exc)) from None


def rollout_view(rollout: Rollout, stages: dict[str, int] | None = None, devices: list[dict] | None = None) -> dict:
    out: dict[str, Any] = {
        "id": rollout.id,
        "group": rollout.group,
        "model": rollout.model,
        "version": rollout.version,
        "previous_version": rollout.previous_version,
        "state": rollout.state,
        "stage": rollout.stage + 1,
        "stages": list(rollout.policy.stages),
        "reason": rollout.reason,
    }
    if stages is not None and devices is not None:
        outcome = {}
        for d in devices:
            status = d.get("status", {})
            if status.get("version") == rollout.version:
                outcome[d["device"]] = "succeeded"
            elif rollout.version in (status.get("rejected") or {}):
                outcome[d["device"]] = "failed"
            else:
                outcome[d["device"]] = "pending"
        out["devices"] = [
            {"device": d["device"], "stage": stages[d["device"]] + 1 if d["device"] in stages else None,
             "outcome": outcome[d["device"]], "last_seen": d.get("last_seen")}
            for d in devices
        ]  # fmt: skip
    return out


class EdgeApi:
    """The routes above as an ASGI app. ``admin(header)`` raises the gateway's 401 or 403 unless the Authorization
    header carries an admin's token; ``resolve(model, version, alias)`` is the registry version they name."""

    def __init__(
        self,
        fleet: Fleet,
        bundles: BundleFiles,
        inference_log: InferenceLogWriter,
        admin: Callable[[str | None], object],
        resolve: Callable[[str, str | None, str | None], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.fleet, self.bundles, self.log, self.admin, self.resolve, self.clock = (
            fleet, bundles, inference_log, admin, resolve, clock,
        )  # fmt: skip
        self.router = Router(
            [
                Route(f"{PREFIX}{path}", getattr(self, handler), methods=[method])
                for method, path, handler, _, _ in ROUTES
            ]
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.router(scope, receive, send)

    # who is asking

    def _admin(self, request: Request) -> None:
        self.admin(request.headers.get("authorization"))

    async def _device(self, request: Request) -> tuple[str, str]:
        """(device, group) of a device's own token for the device in the path (an admin's is refused here: these
        routes act as the device)."""
        device = request.path_params["device"]
        header = request.headers.get("authorization") or ""
        token = header[7:] if header.startswith("Bearer ") else ""
        group = await run_in_threadpool(self.fleet.authenticate, device, token) if token else None
        if group is None:
            raise unauthenticated("a device token for this device is required")
        return device, group

    # routes

    async def _guard(self, work: Callable[[], Any]) -> Response:
        try:
            return await work()
        except ApiError as err:
            return JSONResponse(error_body(err), status_code=err.status_code, headers=err.headers)

    async def _devices(self, request: Request) -> Response:
        async def work() -> Response:
            self._admin(request)
            if request.method == "GET":
                group = request.query_params.get("group")
                return JSONResponse({"devices": await run_in_threadpool(self.fleet.devices, group)})
            doc = await _json(request)
            device, group = _name(doc, "device"), _name(doc, "group")
            token = await run_in_threadpool(self.fleet.register, device, group, self.clock())
            return JSONResponse({"device": device, "group": group, "token": token}, status_code=201)

        return await self._guard(work)

    async def _desired(self, request: Request) -> Response:
        async def work() -> Response:
            device, group = await self._device(request)
            found = await run_in_threadpool(self.fleet.desired, device, group)
            if found is None:
                return JSONResponse({"model": None, "version": None})
            model, version = found
            return JSONResponse(
                {"model": model, "version": version, "bundle": f"{PREFIX}/devices/{device}/bundles/{model}/{version}"}
            )

        return await self._guard(work)

    async def _status(self, request: Request) -> Response:
        async def work() -> Response:
            device, _ = await self._device(request)
            doc = await _json(request)
            rejected = doc.get("rejected") or {}
            if not isinstance(rejected, dict) or not isinstance(doc.get("version"), str | None):
                raise invalid_parameter("version: a string or null; rejected: an object of version -> reason")
            status = {
                "version": doc.get("version"),
                "previous": doc.get("previous"),
                "healthy": bool(doc.get("healthy")),
                "rejected": {str(k)[:64]: str(v)[:300] for k, v in list(rejected.items())[:50]},
                "telemetry": doc.get("telemetry") if isinstance(doc.get("telemetry"), dict) else {},
            }
            await run_in_threadpool(self.fleet.report, device, status, self.clock())
            return JSONResponse({})

        return await self._guard(work)

    async def _telemetry(self, request: Request) -> Response:
        async def work() -> Response:
            device, group = await self._device(request)
            doc = await _json(request)
            records, stream = doc.get("records"), doc.get("stream")
            if not isinstance(records, list) or len(records) > MAX_RECORDS or not isinstance(stream, int):
                raise invalid_parameter(f"records: a list of at most {MAX_RECORDS}; stream: an integer")
            rows = [_record(r, i) for i, r in enumerate(records)]
            new = await run_in_threadpool(self.fleet.take_telemetry, device, stream, [seq for seq, _ in rows])
            endpoint = log_endpoint(group)
            for seq, r in rows:
                if seq in new:
                    self.log.record(_inference_record(r, endpoint, device))
            return JSONResponse({"taken": len(new), "skipped": len(rows) - len(new)})

        return await self._guard(work)

    async def _bundle(self, request: Request) -> Response:
        async def work() -> Response:
            model, version = request.path_params["model"], request.path_params["version"]
            if "device" not in request.path_params:
                self._admin(request)
            else:
                _, group = await self._device(request)
                allowed = await run_in_threadpool(self.fleet.bundles_for, group)
                if (model, version) not in allowed:
                    raise permission_denied(f"{model} v{version} is not a bundle of this device's group's rollout")
            try:
                path = await run_in_threadpool(self.bundles.path, model, version)
            except NoBundle as exc:
                raise not_found(str(exc)) from None
            return FileResponse(path, media_type="application/x-tar")

        return await self._guard(work)

    async def _start(self, request: Request) -> Response:
        async def work() -> Response:
            self._admin(request)
            doc = await _json(request)
            unknown = sorted(set(doc) - {"group", "model", "version", "alias", "stages", "abort", "offline_after_s"})
            if unknown:
                raise invalid_parameter(f"unknown field(s) {unknown}")
            group, model = _name(doc, "group"), _name(doc, "model")
            version, alias = doc.get("version"), doc.get("alias")
            if (version is None) == (alias is None):
                raise invalid_parameter("version or alias: exactly one is required")
            policy = _policy(doc)
            resolved = await run_in_threadpool(self.resolve, model, version and str(version), alias)
            try:
                await run_in_threadpool(self.bundles.check, model, resolved)
            except NoBundle as exc:
                raise invalid_parameter(str(exc)) from None
            rollout = await run_in_threadpool(self.fleet.start, group, model, resolved, policy, self.clock())
            return JSONResponse(rollout_view(rollout), status_code=201)

        return await self._guard(work)

    async def _rollout(self, request: Request) -> Response:
        async def work() -> Response:
            self._admin(request)
            rollout, stages = await run_in_threadpool(self.fleet.rollout, request.path_params["rollout"])
            devices = await run_in_threadpool(self.fleet.devices, rollout.group)
            return JSONResponse(rollout_view(rollout, stages, devices))

        return await self._guard(work)

    async def _abort(self, request: Request) -> Response:
        async def work() -> Response:
            self._admin(request)
            rollout = await run_in_threadpool(
                self.fleet.abort, request.path_params["rollout"], "aborted by an operator", self.clock()
            )
            return JSONResponse(rollout_view(rollout))

        return await self._guard(work)


def _record(raw: Any, index: int) -> tuple[int, dict[str, Any]]:
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("seq"), int)
        or not isinstance(raw.get("timestamp"), int | float)
    ):
        raise invalid_parameter(f"records[{index}]: an object with an integer seq and a numeric timestamp")
    return raw["seq"], raw


def _inference_record(r: dict[str, Any], endpoint: str, device: str) -> InferenceRecord:
    inputs = r.get("inputs")
    status = r.get("status", 200)
    return InferenceRecord(
        request_id=str(r.get("request_id") or f"{device}-{r['seq']}")[:128],
        timestamp=datetime.fromtimestamp(float(r["timestamp"]), UTC),
        endpoint=endpoint,
        served_entity=str(r.get("model") or "")[:128] or None,
        model_version=str(r.get("version") or "")[:64] or None,
        status_code=int(status) if isinstance(status, int) else 200,
        latency_ms=float(r.get("latency_ms") or 0.0),
        inputs=json.dumps({"dataframe_split": _split(inputs)}) if isinstance(inputs, dict) else None,
        served_features=None,
        outputs=json.dumps(r.get("outputs")) if r.get("outputs") is not None else None,
        error_code=None,
        rows=len(next(iter(inputs.values()), [])) if isinstance(inputs, dict) and inputs else 0,
        device=device,
    )


def _split(columns: dict[str, Any]) -> dict[str, Any]:
    """A device's record's inputs (column -> values) as the scoring protocol's ``dataframe_split``, as the
    gateway logs requests."""
    names = list(columns)
    values = [v if isinstance(v, list) else [v] for v in columns.values()]
    return {"columns": names, "data": [list(row) for row in zip(*values)]}
