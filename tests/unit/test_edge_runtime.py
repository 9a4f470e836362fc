"""The edge runtime on its own (``tollfree_edge``): bundles checked before they load, the scoring protocol, a swap
under load with no dropped request, the rollback, and the bounded telemetry buffer. A real server on 127.0.0.1
and real ONNX Runtime sessions; bundles from ``tests.edge_bundles``."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.edge_bundles import INPUTS, onnx_of, write_bundle
from tests.waiting import until
from tollfree_edge import agent as agent_module
from tollfree_edge.agent import Agent, Home
from tollfree_edge.bundle import BundleRefused, unpack, verify
from tollfree_edge.scoring import ScoringError, read_rows
from tollfree_edge.server import EdgeServer
from tollfree_edge.slots import Slots
from tollfree_edge.telemetry import Telemetry

TOKEN = "local-token"


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def device(tmp_path: Path, key: Ed25519PrivateKey):
    (tmp_path / "device").mkdir()
    telemetry = Telemetry(tmp_path / "device" / "telemetry.db")
    server = EdgeServer(("127.0.0.1", 0), TOKEN, telemetry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    agent = Agent(
        Home("http://127.0.0.1:9", "d1", "t"), Slots(tmp_path / "device", key.public_key()), server, telemetry
    )
    yield agent
    server.shutdown()
    telemetry.close()


def _post(url: str, body: dict, token: str = TOKEN) -> httpx.Response:
    return httpx.post(f"{url}/invocations", json=body, headers={"authorization": f"Bearer {token}"}, timeout=10)


def test_a_bundle_with_one_byte_changed_or_signed_by_another_key_is_refused_before_it_loads(
    tmp_path: Path, key: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = write_bundle(tmp_path / "good.tar", key, "1")
    folder = tmp_path / "unpacked"
    unpack(good, folder)
    assert verify(folder, key.public_key()).version == "1"

    loaded = []
    monkeypatch.setattr("onnxruntime.InferenceSession", lambda *a, **k: loaded.append(a))
    model = folder / "model.onnx"
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    with pytest.raises(BundleRefused, match=r"model.onnx: sha256 differs from manifest.json"):
        verify(folder, key.public_key())
    other = write_bundle(tmp_path / "other.tar", Ed25519PrivateKey.generate(), "2")
    slots = Slots(tmp_path / "device", key.public_key())
    with pytest.raises(BundleRefused, match=r"manifest.sig: not a signature of manifest.json by this device's key"):
        slots.install(other)
    assert not slots.has("2") and loaded == []  # nothing kept, no session made

    manifest_changed = tmp_path / "manifest.tar"  # a signed manifest edited after signing: the signature fails
    with tarfile.open(good) as src, tarfile.open(manifest_changed, "w") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()  # type: ignore[union-attr]
            if member.name == "manifest.json":
                data = data.replace(b'"version": "1"', b'"version": "9"')
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data))
    with pytest.raises(BundleRefused, match=r"manifest\.sig"):
        slots.install(manifest_changed)
    with tarfile.open(tmp_path / "escape.tar", "w") as tar:  # a member outside the folder
        tar.add(good, arcname="../model.onnx")
    with pytest.raises(BundleRefused, match="not a plain file at its top level"):
        slots.install(tmp_path / "escape.tar")


def test_the_scoring_protocol_reads_every_format_into_the_model_columns_and_names_what_is_wrong() -> None:
    row = {"amount": 1.5, "hour": 3, "velocity": -2.0, "extra": "ignored"}
    expected = np.array([[1.5, 3.0, -2.0]], dtype=np.float32)
    bodies = [
        {"dataframe_split": {"columns": ["velocity", "amount", "hour"], "data": [[-2.0, 1.5, 3]]}},
        {"dataframe_records": [row]},
        {"instances": [row]},
        {"inputs": {"amount": [1.5], "hour": [3], "velocity": [-2.0]}},
        {"inputs": [[1.5, 3, -2.0]], "params": {}},
    ]
    for body in bodies:
        assert np.array_equal(read_rows(json.dumps(body).encode(), INPUTS), expected), body
    bad = {
        b"not json": "not JSON",
        b"[]": "must be an object",
        b'{"dataframe_records": [{"amount": 1}]}': r"records\[0\]: missing column\(s\) \['hour', 'velocity'\]",
        b'{"dataframe_records": [{"amount": "x", "hour": 1, "velocity": 2}]}': "row 0, column 'amount': not a number",
        b'{"inputs": [[1, 2]]}': "every row needs 3 values",
        b'{"instances": [], "inputs": []}': "exactly one of",
        b'{"dataframe_split": {"columns": ["amount"], "data": [[1]]}}': "missing column",
    }
    for body, message in bad.items():
        with pytest.raises(ScoringError, match=message):
            read_rows(body, INPUTS)


def test_the_server_answers_the_mlflow_protocol_with_a_token_and_refuses_what_is_wrong_without_echoing_it(
    tmp_path: Path, key: Ed25519PrivateKey, device: Agent
) -> None:
    url = device.server.url
    assert httpx.get(f"{url}/ping", timeout=5).status_code == 503  # nothing loaded yet
    assert device.take(write_bundle(tmp_path / "b1.tar", key, "1")) is None
    assert httpx.get(f"{url}/ping", timeout=5).status_code == 200
    _, rows, expected = onnx_of(1)
    answer = _post(url, {"dataframe_split": {"columns": INPUTS, "data": rows[:3].tolist()}})
    assert answer.status_code == 200
    assert np.allclose(answer.json()["predictions"], expected[:3], atol=1e-5)
    assert _post(url, {"dataframe_records": [{"amount": 1}]}, token="wrong").status_code == 401
    refused = _post(url, {"dataframe_records": [{"amount": "secret-value", "hour": 1, "velocity": 1}]})
    assert refused.status_code == 400 and refused.json()["error_code"] == "BAD_REQUEST"
    assert "secret-value" not in refused.text and "amount" in refused.json()["message"]
    version = httpx.get(f"{url}/version", headers={"authorization": f"Bearer {TOKEN}"}, timeout=5).json()
    assert version == {"model": "tiny", "version": "1"}
    assert device.telemetry.pending == 1  # the answered request, not the refused ones


def test_a_new_bundle_is_swapped_in_under_load_with_no_dropped_request_and_a_bad_one_never_serves(
    tmp_path: Path, key: Ed25519PrivateKey, device: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert device.take(write_bundle(tmp_path / "b1.tar", key, "1", seed=1)) is None
    url, stop = device.server.url, threading.Event()
    outcomes: list[tuple[int, str]] = []
    body = {"dataframe_records": [dict(zip(INPUTS, [0.1, 0.2, 0.3]))]}

    def client() -> None:
        with httpx.Client(headers={"authorization": f"Bearer {TOKEN}"}, timeout=10) as http:
            while not stop.is_set():
                try:
                    answer = http.post(f"{url}/invocations", json=body)
                    outcomes.append((answer.status_code, str(answer.json()["predictions"][0][1])))
                except httpx.HTTPError as exc:
                    outcomes.append((0, type(exc).__name__))

    threads = [threading.Thread(target=client) for _ in range(6)]
    for thread in threads:
        thread.start()
    try:
        until(lambda: len(outcomes) > 50, "load on bundle 1", 30)
        assert device.take(write_bundle(tmp_path / "b2.tar", key, "2", seed=2)) is None
        assert device.version == "2" and device.slots.state().previous == "1"
        bad = write_bundle(tmp_path / "b3.tar", key, "3", seed=3, expected_from=4)
        failed = device.take(bad)
        assert failed is not None and failed.startswith("smoke test: smoke answers differ")
        assert device.version == "2"  # the bad bundle never served
        # a bundle whose smoke test passes but whose served answers fail the probe is swapped out again
        monkeypatch.setattr(agent_module, "probe", lambda server, model: "health probe failed (injected)")
        failed = device.take(write_bundle(tmp_path / "b5.tar", key, "5", seed=5))
        assert failed == "rolled back: health probe failed (injected)" and device.version == "2"
        assert device.slots.state().current == "2"
        seen = len(outcomes)
        until(lambda: len(outcomes) > seen + 50, "load after the rollback", 30)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    assert {status for status, _ in outcomes} == {200}, [o for o in outcomes if o[0] != 200][:5]
    assert len({answer for _, answer in outcomes}) >= 2  # bundle 1's answers, then bundle 2's (and 5's, briefly)


def test_a_restarted_device_serves_its_current_bundle_again_verified_and_falls_back_when_it_was_tampered_with(
    tmp_path: Path, key: Ed25519PrivateKey, device: Agent
) -> None:
    assert device.take(write_bundle(tmp_path / "b1.tar", key, "1", seed=1)) is None
    assert device.take(write_bundle(tmp_path / "b2.tar", key, "2", seed=2)) is None
    model = device.slots.bundles / "2" / "model.onnx"
    model.write_bytes(model.read_bytes() + b"\0")  # changed on the device's disk while it was off
    server = EdgeServer(("127.0.0.1", 0), TOKEN)
    restarted = Agent(device.home, Slots(device.slots.folder, key.public_key()), server, device.telemetry)
    restarted.start()
    assert restarted.version == "1" and "sha256 differs" in restarted.rejected["2"]
    restarted.server.server_close()


def test_the_telemetry_buffer_keeps_the_newest_records_counts_the_dropped_and_deletes_only_what_was_acknowledged(
    tmp_path: Path,
) -> None:
    buffer = Telemetry(tmp_path / "t.db", limit=5)
    for i in range(8):
        buffer.record({"i": i})
    assert buffer.pending == 5 and buffer.dropped == 3
    ids, records = buffer.batch(2)
    assert [r["i"] for r in records] == [3, 4]
    buffer.acknowledge(ids)
    reopened = Telemetry(tmp_path / "t.db", limit=5)  # kept across a restart
    assert reopened.pending == 3 and reopened.dropped == 3
    assert [r["i"] for r in reopened.batch(10)[1]] == [5, 6, 7]
    buffer.close()
    reopened.close()


def test_the_runtime_imports_none_of_mlflow_pandas_or_scikit_learn() -> None:
    stack = {"mlflow", "pandas", "sklearn", "serving", "flows", "prefect", "feast", "httpx"}
    code = f"import sys, tollfree_edge.__main__; print(sorted({{m.split('.')[0] for m in sys.modules}} & {stack}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_home_that_refuses_or_does_not_answer_skips_the_step_and_the_device_serves_on(
    tmp_path: Path, key: Ed25519PrivateKey, device: Agent
) -> None:
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(401)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    assert device.take(write_bundle(tmp_path / "b1.tar", key, "1")) is None
    device.step()  # nothing listens at the home it was given
    assert not device.online and "unreachable" in (device.last_error or "")
    refusing = HTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    device.home = Home(f"http://127.0.0.1:{refusing.server_address[1]}", "d1", "revoked")
    device.step()
    assert device.online and "HTTP 401" in (device.last_error or "")
    refusing.shutdown()
    assert _post(device.server.url, {"dataframe_records": [dict(zip(INPUTS, [1, 2, 3]))]}).status_code == 200


def test_the_runtime_command_line_names_what_is_wrong(tmp_path: Path, key: Ed25519PrivateKey, capsys) -> None:
    from tests.edge_bundles import public_pem
    from tollfree_edge.__main__ import main

    public = public_pem(key, tmp_path / "public.pem")
    (tmp_path / "empty.token").write_text("")
    (tmp_path / "not-a-key.pem").write_text("not a key")
    base = ["--folder", str(tmp_path / "device"), "--port", "0"]
    cases = [
        ([*base, "--public-key", str(public), "--token-file", str(tmp_path / "empty.token")], "empty.token is empty"),
        ([*base, "--public-key", str(public), "--token-file", str(tmp_path / "absent")], "cannot read"),
        ([*base, "--public-key", str(tmp_path / "not-a-key.pem"), "--token-file", str(public)], "not a readable PEM"),
        ([*base, "--public-key", str(public), "--token-file", str(public), "--home", "http://h"], "--home needs"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert message in str(stopped.value.code) + capsys.readouterr().err, argv
    (tmp_path / "ok.token").write_text("t")
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"not a tar")
    argv = [*base, "--public-key", str(public), "--token-file", str(tmp_path / "ok.token"), "--bundle", str(bad)]
    assert main(argv) == 2  # nothing to serve: the bundle was refused
    assert "not a readable tar file" in capsys.readouterr().err
