"""An endpoints file: the serving endpoints a deployment should have, as YAML, checked before anything changes.

The file lists endpoints in the serving-endpoints API's create shape::

    endpoints:
      - name: fraud
        config:
          served_entities:
            - entity_name: fraud
              entity_alias: champion
              min_replicas: 1
        ai_gateway:
          rate_limits: [{calls: 100, renewal_period: minute, key: endpoint}]
        tags: [{key: team, value: risk}]

Each endpoint is checked as the gateway checks a create request (``serving.endpoints.validation`` and the AI
gateway's parser), plus: no field the API does not know, no endpoint twice. The first problem is raised as one
``EndpointFileError`` naming the file, the line and the field; nothing is returned half-checked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from serving.endpoints.spec import CreateEndpointRequest, EndpointCoreConfig
from serving.endpoints.validation import normalize_config, validate_endpoint_name
from serving.generative.ai_gateway import AiGatewayConfig, parse_ai_gateway
from serving.protocol.errors import ApiError

Path_ = tuple[str | int, ...]  # a place in the file: keys and list indexes from the top
_ENDPOINT_KEYS = frozenset(CreateEndpointRequest.model_fields)
_CONFIG_KEYS = frozenset(EndpointCoreConfig.model_fields) - {"name"}
_FIELD_PATH = re.compile(r"^([A-Za-z_]+(?:\[\d+\])?(?:\.[A-Za-z_]+(?:\[\d+\])?)*)")


class EndpointFileError(ValueError):
    """The file cannot be applied: ``file:line: field: what is wrong``."""


@dataclass(frozen=True)
class DeclaredEndpoint:
    """One endpoint as the file declares it, checked: its create request, its config normalised, its AI gateway."""

    name: str
    request: CreateEndpointRequest
    config: EndpointCoreConfig
    ai_gateway: AiGatewayConfig | None
    line: int


def _lines(node: yaml.Node, path: Path_, out: dict[Path_, int]) -> None:
    """Every place under ``node`` with its 1-based line."""
    out.setdefault(path, node.start_mark.line + 1)  # a key's own line, where it has one
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[(*path, key.value)] = key.start_mark.line + 1
            _lines(value, (*path, key.value), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def _line_of(lines: dict[Path_, int], path: Path_) -> int:
    """The line of ``path``, else of the nearest place above it that the file has."""
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path, 1)


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top)"


def _parse_message_path(message: str) -> Path_:
    """``served_entities[0].name must ...`` -> ("served_entities", 0, "name"); () when the message names none."""
    found = _FIELD_PATH.match(message)
    if found is None:
        return ()
    path: list[str | int] = []
    for part in found.group(1).split("."):
        name, _, index = part.partition("[")
        path.append(name)
        if index:
            path.append(int(index.rstrip("]")))
    return tuple(path)


class _Checker:
    def __init__(self, source: str, lines: dict[Path_, int]) -> None:
        self.source = source
        self.lines = lines

    def fail(self, path: Path_, message: str) -> EndpointFileError:
        return EndpointFileError(f"{self.source}:{_line_of(self.lines, path)}: {_dotted(path)}: {message}")

    def unknown_keys(self, value: Any, known: frozenset[str], path: Path_) -> None:
        if not isinstance(value, dict):
            raise self.fail(path, "must be a mapping")
        for key in value:
            if key not in known:
                raise self.fail((*path, key), f"unknown field; expected one of {', '.join(sorted(known))}")

    def model(self, cls: type[BaseModel], value: Any, path: Path_) -> Any:
        try:
            return cls.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = (*path, *first["loc"])
            raise self.fail(where, "unknown field" if first["type"] == "extra_forbidden" else first["msg"]) from None

    def api(self, path: Path_, exc: ApiError) -> EndpointFileError:
        message = str(exc)
        named = _parse_message_path(message)
        return self.fail((*path, *named) if named else path, message)

    def endpoint(self, item: Any, i: int) -> DeclaredEndpoint:
        path: Path_ = ("endpoints", i)
        self.unknown_keys(item, _ENDPOINT_KEYS, path)
        if "name" not in item or "config" not in item:
            raise self.fail(path, "an endpoint needs a name and a config")
        self.unknown_keys(item["config"], _CONFIG_KEYS, (*path, "config"))
        request: CreateEndpointRequest = self.model(CreateEndpointRequest, item, path)
        try:
            name = validate_endpoint_name(request.name)
        except ApiError as exc:
            raise self.fail((*path, "name"), str(exc)) from None
        try:
            config = normalize_config(request.config, name)
        except ApiError as exc:
            raise self.api((*path, "config"), exc) from None
        ai_gateway = None
        if request.ai_gateway is not None:
            try:
                ai_gateway = parse_ai_gateway(request.ai_gateway)
            except ApiError as exc:
                raise self.api((*path, "ai_gateway"), exc) from None
        return DeclaredEndpoint(name, request, config, ai_gateway, _line_of(self.lines, path))


def parse_endpoints(text: str, source: str = "<endpoints>") -> list[DeclaredEndpoint]:
    """Every endpoint ``text`` declares, checked; ``EndpointFileError`` on the first problem."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise EndpointFileError(f"{source}:{line}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from None
    lines: dict[Path_, int] = {}
    if node is not None:
        _lines(node, (), lines)
    check = _Checker(source, lines)
    check.unknown_keys(data, frozenset({"endpoints"}), ())
    items = data.get("endpoints")
    if not isinstance(items, list) or not items:
        raise check.fail(("endpoints",), "must be a list of one or more endpoints")
    declared: list[DeclaredEndpoint] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        endpoint = check.endpoint(item, i)
        if endpoint.name in seen:
            raise check.fail(
                ("endpoints", i, "name"),
                f"endpoint {endpoint.name} is declared twice (also endpoints[{seen[endpoint.name]}])",
            )
        seen[endpoint.name] = i
        declared.append(endpoint)
    return declared


def read_endpoints(paths: Sequence[Path]) -> list[DeclaredEndpoint]:
    """The endpoints of every file in ``paths``, each checked, none declared in two files."""
    declared: list[DeclaredEndpoint] = []
    where: dict[str, str] = {}
    for path in paths:
        try:
            text = path.read_text()
        except OSError as exc:
            raise EndpointFileError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
        for endpoint in parse_endpoints(text, str(path)):
            if endpoint.name in where:
                raise EndpointFileError(
                    f"{path}:{endpoint.line}: endpoint {endpoint.name} is also declared in {where[endpoint.name]}"
                )
            where[endpoint.name] = str(path)
            declared.append(endpoint)
    return declared
