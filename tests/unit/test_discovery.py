"""Where the flows and the MLflow plugin find the gateway (``serving.discovery``): a given URL, then
TOLLFREE_GATEWAY_URL, then the newest live record in the state folder, then the default; stale, foreign and
corrupt records skipped; records written atomically and removed only by their own gateway; and a failed
connection that says which URL was tried, where it came from and that TOLLFREE_GATEWAY_URL sets it.
(tests/e2e/test_model_errors.py does the same with a real gateway process.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException

from flows.gateway_api import GatewayApi, GatewayError
from serving.discovery import (
    DEFAULT_URL,
    GatewayRecord,
    client_url,
    live_record,
    read_records,
    remove_record,
    resolve_gateway,
    write_record,
)
from serving.mlflow_plugin import TollfreeDeploymentClient, gateway_address

HOST = socket.gethostname()
T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


def env_of(home: Path, **more: str) -> dict[str, str]:
    return {"TOLLFREE_HOME": str(home), "TOLLFREE_TOKEN": "t" * 32, **more}


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    return child.pid


@pytest.fixture
def refusing_url() -> Iterator[str]:
    """A loopback URL whose port is bound but not listening: a connection to it is refused, and no other
    process can take the port meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_precedence_given_then_the_variable_then_a_live_record_then_the_default(home: Path) -> None:
    gateways = home / "gateways"
    assert resolve_gateway(env_of(home)).url == DEFAULT_URL  # nothing recorded, not even the folder
    write_record(gateways, "http://127.0.0.1:8090")  # this process: alive
    from_record = resolve_gateway(env_of(home))
    assert (from_record.url, from_record.source) == ("http://127.0.0.1:8090", "record")
    assert str(gateways) in from_record.origin and f"pid {os.getpid()}" in from_record.origin
    with_env = env_of(home, TOLLFREE_GATEWAY_URL="127.0.0.1:9000/")
    assert (resolve_gateway(with_env).url, resolve_gateway(with_env).source) == ("http://127.0.0.1:9000", "environment")
    given = resolve_gateway(with_env, "http://gw.internal:7000", "--gateway-url")
    assert (given.url, given.source, given.origin) == ("http://gw.internal:7000", "given", "--gateway-url")
    assert resolve_gateway(env_of(home, TOLLFREE_GATEWAY_URL=" ")).source == "record"  # blank is unset


def test_a_stale_record_a_foreign_host_s_and_a_corrupt_one_are_skipped(home: Path, caplog) -> None:
    gateways = home / "gateways"
    write_record(gateways, "http://127.0.0.1:8091", pid=dead_pid(), now=T0 + timedelta(hours=2))
    write_record(
        gateways, "http://127.0.0.1:8092", pid=os.getpid(), hostname="another-pod", now=T0 + timedelta(hours=1)
    )
    (gateways / "garbage.json").write_text("{not json")
    (gateways / "no-pid.json").write_text(
        json.dumps({"url": "http://127.0.0.1:8093", "hostname": HOST, "started_at": "2026-05-01T12:00:00+00:00"})
    )
    assert resolve_gateway(env_of(home)).source == "default"
    assert "garbage.json" in caplog.text and "no-pid.json" in caplog.text and "not a process id" in caplog.text
    write_record(gateways, "http://127.0.0.1:8094", now=T0)
    assert resolve_gateway(env_of(home)).url == "http://127.0.0.1:8094"  # the live one, though the oldest


def test_the_newest_live_gateway_is_chosen() -> None:
    older = (Path("a.json"), GatewayRecord("http://127.0.0.1:1001", 11, HOST, T0))
    newer = (Path("b.json"), GatewayRecord("http://127.0.0.1:1002", 12, HOST, T0 + timedelta(seconds=5)))
    newest_dead = (Path("c.json"), GatewayRecord("http://127.0.0.1:1003", 13, HOST, T0 + timedelta(seconds=9)))
    assert live_record([older, newer, newest_dead], HOST, alive=lambda pid: pid != 13) == newer
    assert live_record([older, newest_dead], "elsewhere", alive=lambda pid: True) is None


def test_a_record_is_written_whole_and_a_gateway_clears_the_dead_ones_of_its_host(home: Path) -> None:
    gateways = home / "gateways"
    dead = write_record(gateways, "http://127.0.0.1:8095", pid=dead_pid())[0]
    foreign = write_record(gateways, "http://127.0.0.1:8096", pid=dead_pid(), hostname="another-pod")[0]
    path, record = write_record(gateways, "http://127.0.0.1:8097/", now=T0)
    assert not dead.exists() and foreign.exists()  # another host's pid cannot be checked from here
    assert sorted(p.name for p in gateways.iterdir()) == sorted([path.name, foreign.name])  # no temporary file left
    assert (
        GatewayRecord.from_json(path.read_text())
        == record
        == GatewayRecord("http://127.0.0.1:8097", os.getpid(), HOST, T0)
    )
    assert [p for p, _ in read_records(gateways)] == sorted([path, foreign])


def test_a_gateway_removes_its_record_only_while_it_is_still_its_own(home: Path) -> None:
    gateways = home / "gateways"
    path, record = write_record(gateways, "http://127.0.0.1:8098", now=T0)
    _, replaced = write_record(gateways, "http://127.0.0.1:8099", now=T0 + timedelta(seconds=1))  # same pid, restarted
    assert not remove_record(path, record) and path.exists()
    assert remove_record(path, replaced) and not path.exists()
    assert not remove_record(path, replaced)  # already gone: nothing to do


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("0.0.0.0", "http://127.0.0.1:8090"),
        ("::", "http://[::1]:8090"),
        ("::1", "http://[::1]:8090"),
        ("10.1.2.3", "http://10.1.2.3:8090"),
        ("gw.internal", "http://gw.internal:8090"),
    ],
)
def test_the_recorded_url_is_one_a_client_on_this_host_can_use(host: str, url: str) -> None:
    assert client_url(host, 8090) == url


@pytest.mark.parametrize("bad", ["ftp://gw:21", "http://", "http://gw:port", "http://gw:0"])
def test_a_url_that_is_not_http_is_refused_naming_where_it_came_from(home: Path, bad: str) -> None:
    with pytest.raises(ValueError, match=r"TOLLFREE_GATEWAY_URL: .* is not a gateway URL; give http"):
        resolve_gateway(env_of(home, TOLLFREE_GATEWAY_URL=bad))
    with pytest.raises(GatewayError, match="TOLLFREE_GATEWAY_URL"):
        GatewayApi.from_environ(env_of(home, TOLLFREE_GATEWAY_URL=bad))
    with pytest.raises(MlflowException, match=r"the target URI: .* is not a gateway URL"):
        gateway_address(f"tollfree:/{bad}", {})


def test_a_refused_connection_names_the_url_its_source_and_the_variable(home: Path, refusing_url: str) -> None:
    port = refusing_url.rsplit(":", 1)[1]
    path, _ = write_record(home / "gateways", refusing_url)
    cases = {
        "record": (env_of(home), str(path)),
        "environment": (
            env_of(home, TOLLFREE_GATEWAY_URL=f"http://user:hunter2@127.0.0.1:{port}"),
            "came from TOLLFREE_GATEWAY_URL",
        ),
        "default": (env_of(home / "other"), str(home / "other" / "gateways")),
    }
    for source, (environ, says) in cases.items():
        address = resolve_gateway(environ, default=refusing_url)
        assert address.source == source
        with pytest.raises(GatewayError) as failed:
            GatewayApi(address.url, "t" * 32, address=address).names()
        message = str(failed.value)
        assert f"127.0.0.1:{port}" in message and "ConnectError" in message, message
        assert "TOLLFREE_GATEWAY_URL" in message and says in message and "hunter2" not in message, message


def test_the_mlflow_plugin_uses_the_same_resolver(home: Path, refusing_url: str, monkeypatch) -> None:
    path, _ = write_record(home / "gateways", refusing_url)
    monkeypatch.delenv("TOLLFREE_GATEWAY_URL", raising=False)
    monkeypatch.setenv("TOLLFREE_HOME", str(home))
    client = TollfreeDeploymentClient("tollfree")
    assert client.url == refusing_url and gateway_address("tollfree:/gw:81", {}).url == "http://gw:81"
    with pytest.raises(MlflowException) as failed:
        client.list_deployments()
    assert failed.value.error_code == "TEMPORARILY_UNAVAILABLE"
    assert str(path) in failed.value.message and "TOLLFREE_GATEWAY_URL" in failed.value.message
