"""tollfree extension of an endpoint's config: ``stream_inputs``, Redis streams as other front doors to it.

Each input names three streams by URL, ``redis://HOST:PORT/STREAM`` (the path is the stream's key, not a
database number: database 0 always; no user, password, query or fragment): ``source``, read by a consumer
group (``group``) in batches of up to ``batch_size`` entries, waiting up to ``max_wait_ms`` for a batch to
fill; ``sink``, where each answer goes; ``dead_letter``, where an entry that cannot be scored goes. The
consumer writes the sink and the dead letter in one atomic script, so both live on one Redis server.
``max_lag_s`` is the lag the autoscaler drains within.

``check_stream_inputs`` says what the field types cannot, by field and index (``stream_inputs[0].sink``),
never echoing a value. Pure: pydantic and ``serving.protocol.errors`` only.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import NoReturn

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from serving.protocol.errors import invalid_parameter

MAX_STREAM_INPUTS = 8
STREAM_NAME_RE = re.compile(r"^[A-Za-z0-9_:.\-]{1,200}$")
_LABEL_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")
_DOTTED_NUMBERS_RE = re.compile(r"^[0-9.]+$")
_PORT_RE = re.compile(r"^[0-9]{1,5}$")
_SCHEME = "redis://"
_SHAPE = "redis://HOST:PORT/STREAM"


def _host(text: str) -> str | None:
    """The canonical host (lower case, IPv6 without brackets), or None if ``text`` is none of a hostname,
    an IPv4 address or a bracketed IPv6 address."""
    if text.startswith("[") and text.endswith("]"):
        if "%" in text:
            return None  # no zone ("%eth0"): it means something on one machine only
        try:
            return ipaddress.IPv6Address(text[1:-1]).compressed
        except ValueError:
            return None
    if _DOTTED_NUMBERS_RE.match(text):
        try:
            return str(ipaddress.IPv4Address(text))
        except ValueError:
            return None
    labels = text.split(".")
    if len(text) > 253 or not all(_LABEL_RE.match(label) for label in labels):
        return None
    return text.lower()


@dataclass(frozen=True)
class StreamAddress:
    """One Redis stream: the server (``host``, ``port``) and the stream's key (``stream``)."""

    host: str  # canonical: lower case; an IPv6 address without its brackets
    port: int
    stream: str

    @classmethod
    def parse(cls, url: str, where: str) -> StreamAddress:
        """``redis://HOST:PORT/STREAM`` as an address; anything else is a 400 naming ``where``, not the value."""

        def refuse(reason: str) -> NoReturn:
            raise invalid_parameter(f"{where} must be {_SHAPE} ({reason})")

        if not isinstance(url, str) or not url.isascii() or not url.isprintable() or " " in url:
            refuse("a URL of printable ASCII characters without spaces")
        if not url.startswith(_SCHEME):
            refuse("the scheme must be redis")
        if "?" in url or "#" in url:
            refuse("no query or fragment")
        netloc, slash, path = url[len(_SCHEME) :].partition("/")
        if "@" in netloc:
            refuse("no user or password: the server's password is not part of a stream's address")
        text, colon, port = netloc.rpartition(":")
        if not colon or text.startswith("[") != text.endswith("]"):
            refuse("the port is required")
        host = _host(text)
        if host is None:
            refuse("the host must be a hostname, an IPv4 address or a bracketed IPv6 address")
        if not _PORT_RE.match(port) or not 1 <= int(port) <= 65535:
            refuse("the port must be 1 to 65535")
        if not slash or not STREAM_NAME_RE.match(path):
            refuse("the path must be one segment, the stream's name: 1 to 200 letters, digits, '_', ':', '.' or '-'")
        return cls(host, int(port), path)

    @property
    def server(self) -> tuple[str, int]:
        return self.host, self.port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{_SCHEME}{host}:{self.port}/{self.stream}"


class StreamInput(BaseModel):
    """One stream input of an endpoint (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid")
    source: str = Field(max_length=300)
    sink: str = Field(max_length=300)
    dead_letter: str = Field(max_length=300)
    group: str = Field(default="tollfree", pattern=r"^[A-Za-z0-9_:.\-]{1,100}$")
    batch_size: StrictInt = Field(default=100, ge=1, le=1024)
    max_wait_ms: StrictInt = Field(default=10, ge=0, le=10_000)
    max_lag_s: float = Field(default=30.0, gt=0, le=86_400)  # the lag the autoscaler drains within

    @property
    def source_address(self) -> StreamAddress:
        return StreamAddress.parse(self.source, "source")

    @property
    def sink_address(self) -> StreamAddress:
        return StreamAddress.parse(self.sink, "sink")

    @property
    def dead_letter_address(self) -> StreamAddress:
        return StreamAddress.parse(self.dead_letter, "dead_letter")


_ROLES = ("source", "sink", "dead_letter")


def _addresses(i: int, s: StreamInput) -> dict[str, StreamAddress]:
    """The input's three addresses by role; within one input, three different streams, and the sink
    and the dead letter on one server."""
    p = f"stream_inputs[{i}]"
    found = {role: StreamAddress.parse(getattr(s, role), f"{p}.{role}") for role in _ROLES}
    for a, b in (("source", "sink"), ("source", "dead_letter"), ("sink", "dead_letter")):
        if found[a].url == found[b].url:
            raise invalid_parameter(
                f"{p}.{b} is the same stream as {p}.{a}: source, sink and dead_letter must be three different streams"
            )
    if found["sink"].server != found["dead_letter"].server:
        raise invalid_parameter(
            f"{p}.dead_letter must be on the same Redis server (host:port) as {p}.sink: "
            "the consumer writes both in one atomic script"
        )
    return found


def check_stream_inputs(inputs: list[StreamInput]) -> None:
    """What the field types cannot say: the addresses, and no input that reads what another one reads
    with the same group or what any input writes (a loop). A 400 naming the field and its index."""
    if len(inputs) > MAX_STREAM_INPUTS:
        raise invalid_parameter(f"stream_inputs lists at most {MAX_STREAM_INPUTS} inputs")
    addresses = [_addresses(i, s) for i, s in enumerate(inputs)]
    readers: dict[tuple[str, str], int] = {}
    for i, (s, found) in enumerate(zip(inputs, addresses)):
        key = (found["source"].url, s.group)
        if key in readers:
            raise invalid_parameter(
                f"stream_inputs[{i}] reads the same source with the same group as "
                f"stream_inputs[{readers[key]}]: give it another group or drop it"
            )
        readers[key] = i
    sources = {found["source"].url: i for i, found in reversed(list(enumerate(addresses)))}
    for i, found in enumerate(addresses):
        for role in ("sink", "dead_letter"):
            j = sources.get(found[role].url)
            if j is not None:
                raise invalid_parameter(
                    f"stream_inputs[{i}].{role} is the stream stream_inputs[{j}].source reads: "
                    "the endpoint would read its own output (a loop)"
                )
