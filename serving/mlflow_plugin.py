"""MLflow deployments plugin (``mlflow deployments ... -t tollfree``): a deployment is a gateway serving endpoint,
managed through the control plane and scored through invocations. The token (TOLLFREE_TOKEN) is never logged.
The gateway's URL is ``serving.discovery``'s, as for the flows: the target's, else ``TOLLFREE_GATEWAY_URL``, else
the URL a live gateway recorded in the state folder (``TOLLFREE_HOME``), else ``http://127.0.0.1:8080``."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

import httpx
from mlflow.deployments import BaseDeploymentClient, PredictionsResponse
from mlflow.exceptions import MlflowException, get_error_code
from mlflow.protos.databricks_pb2 import ErrorCode
from mlflow.utils.proto_json_utils import NumpyEncoder

from serving.discovery import DEFAULT_URL, URL_ENV, GatewayAddress, resolve_gateway

log = logging.getLogger(__name__)

TOKEN_ENV = "TOLLFREE_TOKEN"
API = "/api/2.0/serving-endpoints"
FLAVOR = "python_function"
SCORING_KEYS = ("dataframe_split", "dataframe_records", "instances", "inputs")
_MODEL_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<ref>[^/@]+))/?$")
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
_BOOL_KEYS = {"scale_to_zero_enabled", "await_ready"}
_CONFIG_KEYS = (
    "min_replicas",
    "max_replicas",
    "max_concurrency",
    "scale_to_zero_enabled",
    "await_ready",
    "timeout_s",
    "stream_inputs",
)
_SCALE_KEYS = ("min_replicas", "max_replicas", "max_concurrency", "scale_to_zero_enabled", "workload_size")
_KEEP_KEYS = ("name", "entity_name", "workload_type", "environment_vars", *_SCALE_KEYS)


def _error(message: str, code: str = "INVALID_PARAMETER_VALUE") -> MlflowException:
    return MlflowException(message, error_code=ErrorCode.Value(code))


def _convert(key: str, value: Any) -> Any:
    """A config value (a string from ``-C key=value``, or a Python value) as the type its key needs."""
    text = str(value).strip().lower()
    if key in _BOOL_KEYS and (isinstance(value, bool) or text in _TRUE | _FALSE):
        return value if isinstance(value, bool) else text in _TRUE
    if key == "timeout_s" and re.fullmatch(r"[0-9]{1,5}(\.[0-9]*)?", text) and 0 < float(text) <= 86_400:
        return float(text)
    if key not in _BOOL_KEYS | {"timeout_s"} and not isinstance(value, bool) and re.fullmatch(r"-?[0-9]{1,9}", text):
        return int(text)
    kind = "true or false" if key in _BOOL_KEYS else "seconds, at most 86400" if key == "timeout_s" else "an integer"
    raise _error(f"config {key} must be {kind}")


def _stream_inputs(value: Any) -> list[dict[str, Any]]:
    """``-C stream_inputs=JSON`` (a list of objects; ``[]`` or ``null``: none), or a Python list of dicts.
    Only the shape is checked here; the gateway checks the inputs themselves, by field."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
            raise _error(f"config stream_inputs is not valid JSON{where}: give a JSON list of objects") from None
    value = [] if value is None else value
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, Mapping) for s in value):
        raise _error("config stream_inputs must be a list of objects (source, sink, dead_letter, ...)")
    return [dict(s) for s in value]


class DeploymentConfig(NamedTuple):
    """A deployment's ``-C`` config: served-entity fields, waiting, and the endpoint's stream inputs."""

    entity: dict[str, Any]  # min/max_replicas, max_concurrency, scale_to_zero_enabled
    await_ready: bool = True
    timeout_s: float = 300.0
    stream_inputs: list[dict[str, Any]] | None = None  # None: not given (an update keeps the endpoint's)


def parse_config(config: Mapping[str, Any] | None) -> DeploymentConfig:
    """The config from ``-C key=value`` strings or Python values; an unknown key or a bad value is refused by name."""
    values: dict[str, Any] = {}
    for key, value in (config or {}).items():
        if key not in _CONFIG_KEYS:
            raise _error(f"unknown config key {str(key)[:64]!r}; the tollfree target takes {', '.join(_CONFIG_KEYS)}")
        values[key] = _stream_inputs(value) if key == "stream_inputs" else _convert(key, value)
    return DeploymentConfig(
        values, values.pop("await_ready", True), values.pop("timeout_s", 300.0), values.pop("stream_inputs", None)
    )


def served_entity(model_uri: str) -> dict[str, str]:
    """``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` as a served entity; anything else is refused."""
    match = _MODEL_URI.match(model_uri or "")
    if match is None:
        raise _error(
            f"model URI {str(model_uri)[:200]!r} is not supported: tollfree serves registered models only, "
            "as models:/NAME@ALIAS or models:/NAME/VERSION (register a runs:/ or path model first)"
        )
    if match["alias"] is not None:
        return {"entity_name": match["name"], "entity_alias": match["alias"]}
    if not match["ref"].isdigit():
        raise _error(
            f"model URI models:/{match['name']}/{match['ref'][:64]} names a stage or 'latest': pin a "
            "version number or use an alias (models:/NAME@ALIAS)"
        )
    return {"entity_name": match["name"], "entity_version": match["ref"]}


def gateway_address(target_uri: str, environ: Mapping[str, str]) -> GatewayAddress:
    """``tollfree:/http://host:port`` -> that URL; ``tollfree`` -> the URL ``serving.discovery`` resolves."""
    try:
        return resolve_gateway(environ, target_uri.partition(":")[2].lstrip("/"), "the target URI")
    except ValueError as exc:
        raise _error(str(exc)) from None


def _unreachable(address: GatewayAddress, exc: httpx.HTTPError) -> MlflowException:
    """A failed connection names the URL and where it came from; a failure later in the exchange, the URL."""
    if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        message = address.unreachable(type(exc).__name__)
    else:
        message = f"tollfree gateway at {address.url} could not be reached ({type(exc).__name__})"
    return _error(message, "TEMPORARILY_UNAVAILABLE")


def scoring_body(inputs: Any, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A DataFrame as ``dataframe_split``, or a dict already in scoring-protocol form, plus ``params``."""
    import pandas as pd

    if isinstance(inputs, pd.DataFrame):
        body: dict[str, Any] = {"dataframe_split": inputs.to_dict(orient="split", index=False)}
    elif isinstance(inputs, Mapping) and sum(k in inputs for k in SCORING_KEYS) == 1:
        body = dict(inputs)
    else:
        raise _error("inputs must be a pandas DataFrame or a dict with exactly one of " + ", ".join(SCORING_KEYS))
    return {**body, "params": dict(params)} if params else body


def _check(endpoint: str | None, flavor: str | None = None) -> None:
    if endpoint is not None:
        raise _error("the tollfree target has no endpoints apart from deployments: leave endpoint unset")
    if flavor not in (None, FLAVOR, "pyfunc"):
        raise _error(f"flavor {str(flavor)[:64]!r} is not supported: tollfree serves the {FLAVOR} flavor only")


def _model_uri(entity: Mapping[str, Any]) -> str:
    """A served entity's model URI: by alias if it has one (its view also shows the resolved version)."""
    alias, version = entity.get("entity_alias"), entity.get("entity_version")
    return f"models:/{entity.get('entity_name')}" + (f"@{alias}" if alias else f"/{version}")


def _deployment(view: Mapping[str, Any], url: str) -> dict[str, Any]:
    """A gateway endpoint view as a deployment dict: name, flavor, state, model_uri, served_entities, ..."""
    config, state, name = view.get("config", {}), view.get("state", {}), str(view.get("name"))
    share = {
        r["served_entity_name"]: r["traffic_percentage"] for r in config.get("traffic_config", {}).get("routes", [])
    }
    entities = [
        {
            "name": e.get("name"),
            "traffic_percentage": share.get(e.get("name")),
            "model_uri": _model_uri(e),
            "version": e.get("entity_version"),
            "state": e.get("state", {}).get("deployment"),
            **{k: e[k] for k in _SCALE_KEYS if k in e},
        }
        for e in config.get("served_entities", [])
    ]
    out = {
        "name": name,
        "flavor": FLAVOR,
        "state": state.get("ready"),
        "config_update": state.get("config_update"),
        "model_uri": entities[0]["model_uri"] if len(entities) == 1 else None,
        "served_entities": entities,
        "config_version": config.get("config_version"),
        "id": view.get("id"),
        "creator": view.get("creator"),
        "invocations_url": f"{url}/serving-endpoints/{quote(name, safe='')}/invocations",
    }
    if config.get("stream_inputs"):
        out["stream_inputs"] = config["stream_inputs"]
    views = [e for key in ("pending_config", "config") for e in (view.get(key) or {}).get("served_entities", [])]
    found = [view.get("state_message")] + [e.get("state", {}).get("deployment_state_message") for e in views]
    message = next((str(m) for m in found if m), None)
    return {**out, "state_message": message} if message else out


class TollfreeDeploymentClient(BaseDeploymentClient):
    """Deployments on a tollfree gateway; every failure is an ``MlflowException``."""

    def __init__(self, target_uri: str) -> None:
        super().__init__(target_uri)
        self.address = gateway_address(target_uri, os.environ)
        self.url = self.address.url
        self._token = os.environ.get(TOKEN_ENV, "").strip()

    def create_deployment(self, name, model_uri, flavor=None, config=None, endpoint=None) -> dict[str, Any]:
        _check(endpoint, flavor)
        fields, wait, timeout_s, streams = parse_config(config)
        body: dict[str, Any] = {"served_entities": [{**served_entity(model_uri), **fields}]}
        if streams is not None:
            body["stream_inputs"] = streams
        view = self._call("POST", API, {"name": name, "config": body})
        log.info("created deployment %s serving %s", name, model_uri)
        return _deployment(self._wait(name, timeout_s) if wait else view, self.url)

    def update_deployment(self, name, model_uri=None, flavor=None, config=None, endpoint=None) -> dict[str, Any]:
        """A new model replaces every served entity (keeping the busiest one's scaling); else config applies to all.
        ``stream_inputs``, when given, replace the endpoint's (``[]``: none); left out, the endpoint's are kept."""
        _check(endpoint, flavor)
        if flavor is not None and model_uri is None:
            raise _error("a flavor can only be given together with a model URI")
        fields, wait, timeout_s, streams = parse_config(config)
        current = self._call("GET", self._path(name))["config"]
        routes = [
            {k: r[k] for k in ("served_entity_name", "traffic_percentage")} for r in current["traffic_config"]["routes"]
        ]
        entities = [
            {**{k: e[k] for k in _KEEP_KEYS if k in e}, **fields, **served_entity(_model_uri(e))}
            for e in current["served_entities"]
        ]
        body: dict[str, Any] = {"served_entities": entities, "traffic_config": {"routes": routes}}
        if model_uri is not None:
            busiest = max(routes, key=lambda r: r["traffic_percentage"])["served_entity_name"]
            base = next(e for e in entities if e.get("name") == busiest)
            body = {
                "served_entities": [
                    {**{k: base[k] for k in _SCALE_KEYS if k in base}, **fields, **served_entity(model_uri)}
                ]
            }
        streams = current.get("stream_inputs") if streams is None else streams  # [] removes them
        if streams is not None:
            body["stream_inputs"] = streams
        view = self._call("PUT", self._path(name) + "/config", body)
        log.info("updating deployment %s%s", name, f" to {model_uri}" if model_uri else "")
        return _deployment(self._wait(name, timeout_s) if wait else view, self.url)

    def delete_deployment(self, name, config=None, endpoint=None) -> None:
        """Idempotent: deleting a deployment that does not exist is not an error."""
        _check(endpoint)
        parse_config(config)
        try:
            self._call("DELETE", self._path(name))
        except MlflowException as exc:
            if exc.get_http_status_code() != 404:
                raise
        log.info("deleted deployment %s (if it existed)", name)

    def list_deployments(self, endpoint=None) -> list[dict[str, Any]]:
        _check(endpoint)
        return [_deployment(v, self.url) for v in self._call("GET", API).get("endpoints", [])]

    def get_deployment(self, name, endpoint=None) -> dict[str, Any]:
        _check(endpoint)
        return _deployment(self._call("GET", self._path(name)), self.url)

    def predict(self, deployment_name=None, inputs=None, endpoint=None, params=None) -> PredictionsResponse:
        if (deployment_name is None) == (endpoint is None):
            raise _error("give exactly one of deployment_name or endpoint")
        name = str(deployment_name if deployment_name is not None else endpoint)
        chat = isinstance(inputs, Mapping) and "messages" in inputs
        body = {**dict(inputs), **(params or {})} if chat else scoring_body(inputs, params)
        payload = self._call("POST", f"/serving-endpoints/{quote(name, safe='')}/invocations", body)
        if chat:
            return PredictionsResponse(payload)  # a chat endpoint's answer: the chat.completion object
        if "predictions" not in payload:
            raise _error(f"the gateway's answer for {name} has no predictions", "INTERNAL_ERROR")
        return PredictionsResponse(payload)

    def predict_stream(self, deployment_name=None, inputs=None, endpoint=None, params=None):
        """A chat endpoint's streamed answer: each ``chat.completion.chunk`` as a dict, as the gateway relays it."""
        if (deployment_name is None) == (endpoint is None):
            raise _error("give exactly one of deployment_name or endpoint")
        if not (isinstance(inputs, Mapping) and "messages" in inputs):
            raise _error("predict_stream takes a chat request: a dict with messages")
        if not self._token:
            raise _error(f"{TOKEN_ENV} is not set: the tollfree gateway needs a bearer token", "UNAUTHENTICATED")
        name = quote(str(deployment_name if deployment_name is not None else endpoint), safe="")
        body = json.dumps({**dict(inputs), **(params or {}), "stream": True})
        headers = {"Authorization": f"Bearer {self._token}", "content-type": "application/json"}
        try:
            with httpx.stream(
                "POST", f"{self.url}/serving-endpoints/{name}/invocations", content=body, headers=headers, timeout=60.0
            ) as reply:
                if not reply.is_success:
                    reply.read()
                    raise _error(
                        f"tollfree gateway: HTTP {reply.status_code}: "
                        f"{str(reply.text)[:500].replace(self._token, '***')}",
                        ErrorCode.Name(get_error_code(reply.status_code)),
                    )
                for line in reply.iter_lines():
                    data = line[5:].strip() if line.startswith("data:") else None
                    if data == "[DONE]":
                        return
                    if data:
                        chunk = json.loads(data)
                        if "error" in chunk:
                            error = chunk["error"]
                            raise _error(
                                "tollfree gateway: the stream ended with "
                                f"{error.get('error_code')}: {error.get('message')}"
                            )
                        yield chunk
        except httpx.HTTPError as exc:
            raise _unreachable(self.address, exc) from None

    @staticmethod
    def _path(name: str) -> str:
        return f"{API}/{quote(str(name), safe='')}"

    def _call(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One gateway request; a non-2xx answer becomes an MlflowException with its error_code and message."""
        if not self._token:
            raise _error(f"{TOKEN_ENV} is not set: the tollfree gateway needs a bearer token", "UNAUTHENTICATED")
        content = None if body is None else json.dumps(body, cls=NumpyEncoder)
        headers = {"Authorization": f"Bearer {self._token}", "content-type": "application/json"}
        try:
            reply = httpx.request(method, self.url + path, content=content, headers=headers, timeout=60.0)
        except httpx.HTTPError as exc:
            raise _unreachable(self.address, exc) from None
        try:
            payload = reply.json()
        except ValueError:
            payload = None
        if reply.is_success and isinstance(payload, dict):
            return payload
        error = payload if isinstance(payload, dict) else {}
        known = error.get("error_code") in ErrorCode.keys()  # noqa: SIM118 - a protobuf enum has no __contains__
        code = str(error["error_code"]) if known else ErrorCode.Name(get_error_code(reply.status_code))
        message = str(error.get("message") or reply.reason_phrase or "no message").replace(self._token, "***")
        raise _error(f"tollfree gateway: {code}: {message} (HTTP {reply.status_code})", code)

    def _wait(self, name: str, timeout_s: float) -> dict[str, Any]:
        """Poll until READY / NOT_UPDATING; a failed or cancelled rollout raises with its state message."""
        deadline = time.monotonic() + timeout_s
        while True:
            view = self._call("GET", self._path(name))
            state = view.get("state", {})
            if state.get("config_update") in ("UPDATE_FAILED", "UPDATE_CANCELED"):
                message = _deployment(view, self.url).get("state_message") or "no state message; see the gateway log"
                raise _error(f"deployment {name} failed ({state['config_update']}): {message}", "INTERNAL_ERROR")
            if state.get("ready") == "READY" and state.get("config_update") == "NOT_UPDATING":
                return view
            if time.monotonic() >= deadline:
                raise _error(f"deployment {name} not ready after {timeout_s:.0f}s ({state})", "DEADLINE_EXCEEDED")
            time.sleep(0.5)


def run_local(name: str, model_uri: str, flavor: str | None = None, config: dict[str, Any] | None = None) -> None:
    """Not supported: the gateway runs the replicas (MLflow calls this without the target, as for sagemaker)."""
    raise _error(
        "run_local is not supported by the tollfree target: start the gateway with `python -m serving "
        "--host 127.0.0.1 --port 8080`, then use `mlflow deployments create -t tollfree`",
        "NOT_IMPLEMENTED",
    )


def target_help() -> str:
    return f"""Deploys registered MLflow models to a tollfree gateway (python -m serving).
Target: `tollfree` (gateway ${URL_ENV}, else the URL a running gateway recorded in $TOLLFREE_HOME/gateways/,
else {DEFAULT_URL}) or `tollfree:/http://HOST:PORT`; token ${TOKEN_ENV}.
Model URI: models:/NAME@ALIAS or models:/NAME/VERSION (runs:/ URIs and paths are refused). Flavor: {FLAVOR}.
Config (-C key=value): min_replicas, max_replicas, max_concurrency (integers), scale_to_zero_enabled (true|false;
min_replicas must be 0 exactly when true), await_ready (true|false, default true), timeout_s (default 300),
stream_inputs (a JSON list of {{"source", "sink", "dead_letter": "redis://HOST:PORT/STREAM", "group", "batch_size",
"max_wait_ms", "max_lag_s"}}: Redis streams the endpoint also reads; on update, left out keeps the current ones).
update -m NEW_URI replaces the served entity, keeping its scaling unless -C overrides it; without -m, -C applies
to the current served entities. predict takes a DataFrame (sent as dataframe_split) or a scoring-protocol dict;
for a chat endpoint, a dict with messages (the chat.completion comes back); predict_stream yields its chunks.
"""
