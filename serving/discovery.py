"""Where a gateway listens: the record a gateway keeps in the state folder, and the one resolver its clients use.

``python -m serving`` writes ``$TOLLFREE_HOME/gateways/<host>-<pid>.json`` once uvicorn listens (so with
``--port 0`` the real port), atomically (a temporary file renamed into place), and removes it first thing on a
clean shutdown if the file is still its own. A record holds the URL for clients (an unspecified bind address as
loopback), the gateway's pid, its host name and its start time.

A client (the flows' ``GatewayApi``, the MLflow deployments plugin) resolves the URL in this order, first found
wins: a URL given explicitly (a flow's ``gateway_url``, the plugin's ``tollfree:/URL`` target),
``TOLLFREE_GATEWAY_URL``, the newest live record in its state folder, ``http://127.0.0.1:8080``. Gateways on one
state folder share their endpoints' state, so any live one serves the control plane; the newest is the one
most likely just started by hand. A record is live when it was written on this host and its pid runs; other
hosts' records (a state folder shared by pods) are skipped, as their pids and loopback URLs mean nothing here.
Failure mode: a gateway killed without a clean shutdown, whose pid has since gone to another process, looks
live; the connection error then names the record's file, and ``TOLLFREE_GATEWAY_URL`` overrides it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from ipaddress import ip_address
from pathlib import Path
from urllib.parse import urlsplit

from serving.settings import Settings

log = logging.getLogger(__name__)

URL_ENV = "TOLLFREE_GATEWAY_URL"
DEFAULT_URL = "http://127.0.0.1:8080"
# asyncio and uvloop bind "::" for IPv6 only (IPV6_V6ONLY), so its clients need ::1, not 127.0.0.1.
_LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}


@dataclass(frozen=True)
class GatewayRecord:
    """What a gateway writes about itself: the URL its clients use, its pid, host name and start time (UTC)."""

    url: str
    pid: int
    hostname: str
    started_at: datetime

    def to_json(self) -> str:
        return (
            json.dumps(
                {
                    "url": self.url,
                    "pid": self.pid,
                    "hostname": self.hostname,
                    "started_at": self.started_at.isoformat(),
                },
                indent=1,
            )
            + "\n"
        )

    @classmethod
    def from_json(cls, text: str) -> GatewayRecord:
        """The record in ``text``; ValueError naming what is wrong (not JSON, a field missing or malformed)."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        url, pid, hostname, started = (data.get(k) for k in ("url", "pid", "hostname", "started_at"))
        if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            raise ValueError(f"pid {str(pid)[:20]!r} is not a process id")
        if not isinstance(hostname, str) or not hostname:
            raise ValueError("no hostname")
        if not isinstance(url, str) or not isinstance(started, str):
            raise ValueError("no url or no started_at")
        started_at = datetime.fromisoformat(started)
        if started_at.tzinfo is None:
            raise ValueError("started_at has no time zone")
        return cls(normal_url(url, "url"), pid, hostname, started_at)


Found = tuple[Path, GatewayRecord]  # a record and the file it was read from


@dataclass(frozen=True)
class GatewayAddress:
    """A resolved gateway URL and where it came from (``given``, ``environment``, ``record``, ``default``;
    ``origin`` names the argument, the record's file or the records' folder), so a failure can say both."""

    url: str
    source: str
    origin: str

    def unreachable(self, reason: str) -> str:
        """The message for a failed connection: the URL tried, where it came from, and how to set it."""
        head = f"no tollfree gateway answered at {_shown(self.url)} ({reason})"
        if self.source == "given":
            return f"{head}; the URL was given as {self.origin}: check it (a given URL wins over {URL_ENV})"
        if self.source == "environment":
            return f"{head}; the URL came from {URL_ENV}: start the gateway there, or set {URL_ENV} to its URL"
        if self.source == "record":
            return (
                f"{head}; the URL came from the gateway record {self.origin}: that gateway may have just stopped; "
                f"set {URL_ENV} to the URL of a running gateway"
            )
        return (
            f"{head}; that is the default URL, as {URL_ENV} is not set and no live gateway on this host has "
            f"recorded its URL in {self.origin}: set {URL_ENV} to the gateway's URL (e.g. http://127.0.0.1:8090), "
            f"or give `python -m serving` and this process the same TOLLFREE_HOME"
        )


def resolve_gateway(
    environ: Mapping[str, str],
    given: str | None = None,
    given_as: str = "an argument",
    *,
    hostname: str | None = None,
    alive: Callable[[int], bool] | None = None,
    default: str = DEFAULT_URL,
) -> GatewayAddress:
    """The gateway's URL: ``given``, else ``TOLLFREE_GATEWAY_URL``, else the newest live record in the state
    folder of ``environ`` (``TOLLFREE_HOME``), else ``default``. ValueError if the URL chosen is not http(s)."""
    if given and given.strip():
        return GatewayAddress(normal_url(given, given_as), "given", given_as)
    if environ.get(URL_ENV, "").strip():
        return GatewayAddress(normal_url(environ[URL_ENV], URL_ENV), "environment", URL_ENV)
    folder = Settings.from_environ(environ).gateways_dir
    found = live_record(read_records(folder), hostname or socket.gethostname(), alive or pid_alive)
    if found is not None:
        path, record = found
        log.debug("gateway URL %s from %s", record.url, path)
        return GatewayAddress(
            record.url, "record", f"{path} (pid {record.pid}, started {record.started_at:%Y-%m-%d %H:%M:%S %Z})"
        )
    return GatewayAddress(normal_url(default, "the default"), "default", str(folder))


def live_record(found: Iterable[Found], hostname: str, alive: Callable[[int], bool]) -> Found | None:
    """The newest record written on ``hostname`` whose pid is ``alive``; None if there is none."""
    live = [(path, record) for path, record in found if record.hostname == hostname and alive(record.pid)]
    return max(live, key=lambda f: (f[1].started_at, f[1].pid), default=None)


def read_records(folder: Path) -> list[Found]:
    """Every readable record in ``folder`` (none if it does not exist); an unreadable one is logged and skipped."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            out.append((path, GatewayRecord.from_json(path.read_text())))
        except FileNotFoundError:  # removed by its gateway since the listing
            continue
        except (OSError, ValueError) as exc:
            log.warning("ignoring the gateway record %s: %s", path, exc)
    return out


def write_record(
    folder: Path,
    url: str,
    *,
    pid: int | None = None,
    hostname: str | None = None,
    now: datetime | None = None,
    alive: Callable[[int], bool] | None = None,
) -> Found:
    """Record ``url`` for this process (its path and record, to remove it later), atomically; first remove the
    records of gateways on this host that are gone (killed without a clean shutdown)."""
    record = GatewayRecord(
        normal_url(url, "url"), pid or os.getpid(), hostname or socket.gethostname(), now or datetime.now(UTC)
    )
    folder.mkdir(parents=True, exist_ok=True)
    for stale, old in read_records(folder):
        if old.hostname == record.hostname and old.pid != record.pid and not (alive or pid_alive)(old.pid):
            stale.unlink(missing_ok=True)
    path = folder / f"{record_name(record.hostname, record.pid)}.json"
    fd, temporary = tempfile.mkstemp(dir=folder, prefix=f".{path.stem}.", suffix=".tmp")  # not *.json: never read
    try:
        with os.fdopen(fd, "w") as out:
            out.write(record.to_json())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path, record


def record_name(hostname: str, pid: int) -> str:
    """A gateway's name in the state folder's files: its host name (file-safe, at most 64 characters), then its pid."""
    return f"{re.sub(r'[^A-Za-z0-9.-]', '_', hostname)[:64]}-{pid}"


def remove_record(path: Path, record: GatewayRecord) -> bool:
    """Remove the record at ``path`` if it is still ``record`` (another process may have replaced it)."""
    try:
        if GatewayRecord.from_json(path.read_text()) != record:
            return False
    except (OSError, ValueError):
        return False
    path.unlink(missing_ok=True)
    return True


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this host (another user's process counts: it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, ValueError):
        return False
    return True


def client_url(host: str, port: int, scheme: str = "http") -> str:
    """The URL a client on this host uses for a server bound to ``host``: an unspecified address as loopback."""
    host = _LOOPBACK.get(host, host)
    try:
        bracket = ip_address(host).version == 6
    except ValueError:
        bracket = False
    return f"{scheme}://{f'[{host}]' if bracket else host}:{port}"


def normal_url(url: str, source: str) -> str:
    """``url`` without a trailing slash (``http://`` added to a bare ``host:port``); ValueError naming ``source``
    if it is not an http(s) URL with a host and a valid port."""
    text = url.strip()
    text = text if "://" in text else f"http://{text}"
    parts = urlsplit(text)
    try:
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid:
        raise ValueError(f"{source}: {_shown(url.strip())[:200]!r} is not a gateway URL; give http(s)://HOST:PORT")
    return text.rstrip("/")


def _shown(url: str) -> str:
    """The URL without its user and password, fit for a message."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]).geturl()
