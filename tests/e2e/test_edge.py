"""Edge devices as processes (``python -m tollfree_edge``), each in a network namespace of the test's own with its
own folder and token, polling a real gateway for rollouts through HAProxy on their links' root ends.

What must hold:
- a rollout reaches every online device; a device whose link is down holds no stage up and takes the version
  when its link is back;
- a bundle that fails its smoke test on the first stage's device stops the rollout by itself (aborted), and every
  device serves the version before it, with no request to any device failing meanwhile;
- the requests a device answered while its link was down reach the inference log, all of them, once it is back,
  under the group's endpoint with the device's id; the drift flow reports on the group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pandas as pd
import pytest
from mlflow import MlflowClient

from flows.edge_bundle import edge_bundle
from flows.skew import skew
from serving.edge.api import log_endpoint
from serving.edge.bundle_files import BUNDLE_TAG, SHA_TAG
from serving.edge.signing import load_private_key, public_key_path
from serving.gateway.process import GatewayProcess, environ_with, start_gateway
from serving.inference_log import read_inference_log
from serving.replicas.local import free_port
from tests.gateways import own_state
from tests.netns import Host, NamespacesUnavailable, namespace_host
from tests.waiting import until
from tests.world import World, champion_copy
from tollfree_edge import bundle

pytestmark = pytest.mark.slow

MODEL = "fraud_device"
GROUP = "shops"
GATES = {"gate.quality": "pass", "gate.data": "pass"}
DEVICE_PORT = 8080
LOCAL_TOKEN = "device-local-token"


def _admin() -> dict[str, str]:
    return {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}


def _bad_copy(client: MlflowClient, good: str, key_path: Path, tmp: Path) -> str:
    """A new version whose bundle is ``good``'s with its smoke answers changed, signed by the publisher: it passes
    every check but the device's smoke test (a model that answers differently on the device than it was verified)."""
    version = champion_copy(client, MODEL, GATES)
    source = Path(
        client.download_artifacts(client.get_model_version(MODEL, good).run_id, f"edge/{MODEL}-{good}.tar", str(tmp))
    )
    folder = tmp / "bad"
    bundle.unpack(source, folder)
    manifest = json.loads((folder / bundle.MANIFEST).read_text())
    manifest["version"] = version
    manifest["smoke"]["expected"] = [[1 - p for p in row] for row in manifest["smoke"]["expected"]]
    (folder / bundle.MANIFEST).write_text(json.dumps(manifest))
    bundle.sign(folder, load_private_key(key_path))
    archive = tmp / f"{MODEL}-{version}.tar"
    bundle.pack(folder, archive)
    run_id = client.get_model_version(MODEL, version).run_id
    client.log_artifact(run_id, str(archive), "edge")
    client.set_model_version_tag(MODEL, version, BUNDLE_TAG, f"edge/{archive.name}")
    client.set_model_version_tag(MODEL, version, SHA_TAG, bundle.sha256(archive))
    return version


class Device:
    def __init__(self, name: str, host: Host, folder: Path, home_url: str, token: str, public_key: Path) -> None:
        self.name, self.host, self.folder = name, host, folder
        folder.mkdir(parents=True)
        (folder / "local.token").write_text(LOCAL_TOKEN)
        (folder / "device.token").write_text(token)
        self.log = open(folder / "device.log", "ab")  # noqa: SIM115 - closed in stop()
        command = [
            *host.runner, sys.executable, "-m", "tollfree_edge", "--folder", str(folder), "--public-key",
            str(public_key), "--token-file", str(folder / "local.token"), "--host", host.address, "--port",
            str(DEVICE_PORT), "--home", home_url, "--device", name, "--device-token-file", str(folder / "device.token"),
            "--poll-s", "0.3",
        ]  # fmt: skip
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, cwd=str(folder))

    @property
    def url(self) -> str:
        return f"http://{self.host.address}:{DEVICE_PORT}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class Load:
    """One closed-loop client per device: (device, sent, status; 0 for a transport error)."""

    def __init__(self, devices: list[Device], body: dict) -> None:
        self.outcomes: list[tuple[str, float, int]] = []
        self.paused: set[str] = set()
        self._stop = threading.Event()
        headers = {"authorization": f"Bearer {LOCAL_TOKEN}"}

        def one(device: Device) -> None:
            with httpx.Client(headers=headers, timeout=10) as http:
                while not self._stop.is_set():
                    if device.name in self.paused:
                        time.sleep(0.05)
                        continue
                    sent = time.time()
                    try:
                        status = http.post(f"{device.url}/invocations", json=body).status_code
                    except httpx.HTTPError:
                        status = 0
                    self.outcomes.append((device.name, sent, status))
                    time.sleep(0.02)

        self._threads = [threading.Thread(target=one, args=(d,), daemon=True) for d in devices]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)


def _relay(hosts: list[Host], port: int, gateway_port: int, folder: Path) -> subprocess.Popen:
    """HAProxy on each device link's root end, in front of the gateway: where the devices reach home."""
    from infra.packages import ensure_haproxy

    binds = "\n".join(f"    bind {h.peer}:{port}" for h in hosts)
    config = folder / "haproxy.cfg"
    config.write_text(
        "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"
        f"frontend devices\n{binds}\n    default_backend home\n"
        f"backend home\n    server gateway 127.0.0.1:{gateway_port}\n"
    )
    return subprocess.Popen(
        [ensure_haproxy(), "-f", str(config), "-db"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )


@pytest.fixture
def hosts() -> Iterator[list[Host]]:
    try:
        with namespace_host() as a, namespace_host() as b, namespace_host() as c, namespace_host() as d:
            yield [a, b, c, d]
    except NamespacesUnavailable as exc:
        pytest.skip(str(exc))


def _devices(gateway: GatewayProcess) -> dict[str, dict]:
    listed = httpx.get(f"{gateway.url}/api/2.0/edge/devices?group={GROUP}", headers=_admin(), timeout=10).json()
    return {d["device"]: d.get("status", {}) for d in listed["devices"]}


def _rollout(gateway: GatewayProcess, version: str, stages: list[float]) -> str:
    body = {"group": GROUP, "model": MODEL, "version": version, "stages": stages, "offline_after_s": 2}
    started = httpx.post(f"{gateway.url}/api/2.0/edge/rollouts", json=body, headers=_admin(), timeout=30)
    assert started.status_code == 201, started.text
    return str(started.json()["id"])


def _state(gateway: GatewayProcess, rollout: str) -> dict:
    return httpx.get(f"{gateway.url}/api/2.0/edge/rollouts/{rollout}", headers=_admin(), timeout=10).json()


def test_a_staged_rollout_reaches_online_devices_stops_on_a_bad_bundle_and_telemetry_comes_home(
    world: World, hosts: list[Host], tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    client = MlflowClient(world.settings.tracking_uri)
    key = tmp_path / "keys" / "signing-key.pem"
    first = champion_copy(client, MODEL, GATES)
    edge_bundle(MODEL, "champion", key_path=str(key))
    second = champion_copy(client, MODEL, GATES)
    edge_bundle(MODEL, "champion", key_path=str(key))
    bad = _bad_copy(client, second, key, tmp_path / "bad")

    state = Path(tempfile.mkdtemp(prefix="tollfree-edge-"))
    env = environ_with({"TOLLFREE_WARM_POOL": "0", **own_state(state)})
    gateway = start_gateway(env, state / "gateway.log", timeout_s=120)
    relay_port = free_port()
    relay = _relay(hosts, relay_port, int(gateway.url.rsplit(":", 1)[1]), state)
    devices: list[Device] = []
    load: Load | None = None
    try:
        for i, host in enumerate(hosts):
            made = httpx.post(
                f"{gateway.url}/api/2.0/edge/devices", json={"device": f"d{i}", "group": GROUP}, headers=_admin()
            )
            assert made.status_code == 201, made.text
            home = f"http://{host.peer}:{relay_port}"
            devices.append(Device(f"d{i}", host, state / f"d{i}", home, made.json()["token"], public_key_path(key)))
        one = _rollout(gateway, first, [1.0])
        until(lambda: all(s.get("version") == first for s in _devices(gateway).values()), "v1 on every device", 60, 0.2)
        assert _state(gateway, one)["state"] == "completed"

        body = {"dataframe_records": [dict(zip(_inputs(devices[0]), [0.5] * 64))]}
        load = Load(devices, body)
        until(lambda: len(load.outcomes) > 100, "load on the devices", 30, 0.1)

        # d3's link down: it serves its local callers, keeps their records, and holds no stage up
        offline = devices[3]
        load.paused.add(offline.name)
        offline.host.cut()
        cut_at = time.time()
        answered_offline = _local_requests(offline, 40)
        assert answered_offline == 40
        two = _rollout(gateway, second, [0.25, 1.0])
        online = [d.name for d in devices[:3]]
        until(lambda: _state(gateway, two)["state"] == "completed", "the rollout of v2 to complete", 60, 0.2)
        assert all(_devices(gateway)[d].get("version") == second for d in online)
        assert _devices(gateway)[offline.name].get("version") == first
        offline.host.heal()
        healed_at = time.time()
        until(lambda: _devices(gateway)[offline.name].get("version") == second, "v2 on the returning device", 60, 0.2)
        load.paused.discard(offline.name)

        # its records from the cut arrive, all of them
        def offline_records() -> int:
            log = read_inference_log(world.settings.inference_log_dir, endpoint=log_endpoint(GROUP))
            sent = log[(log["device"] == offline.name)]["timestamp"]
            return int(
                (
                    (sent >= pd.Timestamp(cut_at, unit="s", tz="UTC"))
                    & (sent < pd.Timestamp(healed_at, unit="s", tz="UTC"))
                ).sum()
            )

        until(lambda: offline_records() == answered_offline, "the offline device's records in the log", 60, 0.5)

        # a bad bundle: the first stage's device refuses it; the rollout stops and nobody leaves v2
        three = _rollout(gateway, bad, [0.25, 1.0])
        until(lambda: _state(gateway, three)["state"] == "aborted", "the bad rollout to abort", 60, 0.2)
        aborted = _state(gateway, three)
        (canary,) = [d for d in aborted["devices"] if d["stage"] == 1]
        assert canary["outcome"] == "failed" and "smoke test" in _devices(gateway)[canary["device"]]["rejected"][bad]
        seen = len(load.outcomes)
        until(lambda: len(load.outcomes) > seen + 100, "load after the abort", 30, 0.1)
        assert all(s.get("version") == second for s in _devices(gateway).values())
    finally:
        if load is not None:
            load.stop()
        for device in devices:
            device.stop()
        relay.terminate()
        relay.wait(timeout=10)
        gateway.stop()
    statuses = [status for _, _, status in load.outcomes]
    record_property("edge_rollout", {"requests": len(statuses), "failed": sum(s != 200 for s in statuses)})
    assert set(statuses) == {200}, [o for o in load.outcomes if o[2] != 200][:10]

    summary = skew(log_endpoint(GROUP), fail_on_finding=False, min_rows=10, parity_sample=0)
    assert summary["rows"] >= 100 and f"{MODEL}/{second}" in summary["versions"], summary
    shutil.rmtree(state, ignore_errors=True)


def _inputs(device: Device) -> list[str]:
    slots = json.loads((device.folder / "slots.json").read_text())
    return list(json.loads((device.folder / "bundles" / slots["current"] / "manifest.json").read_text())["inputs"])


def _local_requests(device: Device, count: int) -> int:
    """``count`` requests from a local caller inside the device's namespace; how many were answered 200."""
    row = dict(zip(_inputs(device), [0.25] * 64))
    code = (
        "import json, sys, urllib.request\n"
        f"body = json.dumps({{'dataframe_records': [{row!r}]}}).encode()\n"
        "ok = 0\n"
        f"for _ in range({count}):\n"
        f"    r = urllib.request.Request('{device.url}/invocations', data=body, method='POST')\n"
        f"    r.add_header('authorization', 'Bearer {LOCAL_TOKEN}')\n"
        "    r.add_header('content-type', 'application/json')\n"
        "    with urllib.request.urlopen(r, timeout=10) as answer:\n"
        "        ok += answer.status == 200\n"
        "print(ok)\n"
    )
    out = subprocess.run([*device.host.runner, sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip())
