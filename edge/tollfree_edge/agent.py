"""The device's side of a rollout: poll home for the desired bundle, take it or roll back, report, upload.

Each ``step`` (every ``poll_s``) asks home which bundle this device should serve (a pull: a device behind NAT
needs no inbound port). A new version is downloaded, installed (``Slots.install``: signature, then digests),
loaded, and put through the bundle's smoke test before it serves anything; then it is swapped in and the
server's own ``/invocations`` is probed with a smoke row. A bundle that fails any of these is not served (or is
swapped out again, to the bundle served before: the rollback), is remembered as rejected, and is not tried again
until home names another version. Then the device reports its status, and uploads its telemetry in batches.

Home unreachable (no link, home down) or refusing (a revoked token) only skips the step's calls: the device goes
on serving what it has, its records stay in the local buffer, and the next step tries again.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tollfree_edge.bundle import BundleRefused
from tollfree_edge.model import EdgeModel
from tollfree_edge.server import PROBE_HEADER, EdgeServer
from tollfree_edge.slots import Slots, SlotState
from tollfree_edge.telemetry import Telemetry

UPLOAD_BATCH = 500


class HomeUnreachable(Exception):
    """No answer from home (no link, refused, timed out, 5xx): the step is skipped."""


class HomeRefused(Exception):
    """Home answered 4xx (a revoked token, an unknown device): the step is skipped, the device serves on."""


@dataclass
class Home:
    """The gateway's edge API for one device."""

    url: str
    device: str
    token: str
    timeout_s: float = 5.0

    def _call(self, method: str, path: str, doc: dict[str, Any] | None = None) -> bytes:
        data = json.dumps(doc).encode() if doc is not None else None
        request = urllib.request.Request(f"{self.url.rstrip('/')}{path}", data=data, method=method)
        request.add_header("authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("content-type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code >= 500:
                raise HomeUnreachable(f"home answered {exc.code}") from None
            raise HomeRefused(f"home refused {method} {path.split('?')[0]}: HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise HomeUnreachable(f"home unreachable ({type(exc).__name__})") from None

    def desired(self) -> dict[str, Any]:
        return dict(json.loads(self._call("GET", f"/api/2.0/edge/devices/{self.device}/desired")))

    def download(self, path: str, to: Path) -> None:
        partial = to.with_name(to.name + ".partial")
        partial.write_bytes(self._call("GET", path))
        partial.replace(to)

    def report(self, status: dict[str, Any]) -> None:
        self._call("POST", f"/api/2.0/edge/devices/{self.device}/status", status)

    def upload(self, stream: int, records: list[dict[str, Any]]) -> None:
        self._call("POST", f"/api/2.0/edge/devices/{self.device}/telemetry", {"stream": stream, "records": records})


def probe(server: EdgeServer, model: EdgeModel, timeout_s: float = 5.0) -> str | None:
    """None when the server answers ``/ping`` and a smoke row on ``/invocations`` within tolerance, else why not."""
    row = dict(zip(model.manifest.inputs, model.manifest.smoke_rows[0]))
    body = json.dumps({"dataframe_records": [row]}).encode()
    request = urllib.request.Request(f"{server.url}/invocations", data=body, method="POST")
    request.add_header("authorization", f"Bearer {server.token}")
    request.add_header("content-type", "application/json")
    request.add_header(PROBE_HEADER, "1")
    try:
        with urllib.request.urlopen(f"{server.url}/ping", timeout=timeout_s):
            pass
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            got = json.loads(response.read())["predictions"][0]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        return f"health probe failed ({type(exc).__name__})"
    expected = model.manifest.smoke_expected[0]
    if len(got) != len(expected) or max(abs(a - b) for a, b in zip(got, expected)) > model.manifest.tolerance:
        return "health probe answered outside the bundle's tolerance"
    return None


@dataclass
class Agent:
    home: Home
    slots: Slots
    server: EdgeServer
    telemetry: Telemetry
    poll_s: float = 5.0
    rejected: dict[str, str] = field(default_factory=dict)  # version -> why it is not served
    last_error: str | None = None
    online: bool = False

    def start(self) -> None:
        """Serve the current bundle kept on disk, else the previous one (each verified again before it loads)."""
        state = self.slots.state()
        for version in (state.current, state.previous):
            if version and self.slots.has(version):
                try:
                    model = self.slots.load(version)
                except BundleRefused as exc:
                    self.rejected[version] = str(exc)
                    continue
                except Exception as exc:  # ONNX Runtime could not load it: the previous one, if any
                    self.rejected[version] = f"the model did not load ({type(exc).__name__})"
                    continue
                self.server.swap(model)
                if version != state.current:
                    self.slots.save(SlotState(current=version, previous=None))
                return

    @property
    def version(self) -> str | None:
        model = self.server.model
        return model.version if model else None

    def take(self, archive: Path) -> str | None:
        """Serve the bundle in ``archive`` if it passes every check, else keep what is served; why not, or None."""
        try:
            manifest = self.slots.install(archive)
            candidate = self.slots.load(manifest.version)
        except BundleRefused as exc:
            return f"refused: {exc}"
        except Exception as exc:  # a signed model ONNX Runtime cannot load: refused like any other bad bundle
            return f"refused: the model did not load ({type(exc).__name__})"
        failed = candidate.smoke_test()
        if failed:
            return f"smoke test: {failed}"
        old = self.server.swap(candidate)
        failed = probe(self.server, candidate)
        if failed:
            self.server.swap(old)  # the rollback: the bundle served before, with no request refused between
            return f"rolled back: {failed}"
        self.slots.save(SlotState(current=manifest.version, previous=old.version if old else None))
        self.slots.prune()
        return None

    def step(self) -> None:
        try:
            desired = self.home.desired()
            self.online = True
            version = desired.get("version")
            if version and version != self.version and version not in self.rejected:
                archive = self.slots.folder / "download.tar"
                self.home.download(str(desired["bundle"]), archive)
                failed = self.take(archive)
                archive.unlink(missing_ok=True)
                if failed:
                    self.rejected[str(version)] = failed
            self.home.report(self.status())
            self._upload()
            self.last_error = None
        except HomeUnreachable as exc:
            self.online, self.last_error = False, str(exc)
        except HomeRefused as exc:
            self.online, self.last_error = True, str(exc)

    def _upload(self) -> None:
        while True:
            ids, records = self.telemetry.batch(UPLOAD_BATCH)
            if not records:
                return
            self.home.upload(self.telemetry.stream, records)
            self.telemetry.acknowledge(ids)

    def status(self) -> dict[str, Any]:
        state = self.slots.state()
        return {
            "version": self.version,
            "previous": state.previous,
            "healthy": self.server.model is not None,
            "rejected": dict(self.rejected),
            "telemetry": {"pending": self.telemetry.pending, "dropped": self.telemetry.dropped},
        }

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.step()
            stop.wait(self.poll_s)
