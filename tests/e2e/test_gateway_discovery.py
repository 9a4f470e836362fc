"""A gateway started by hand on another port (``python -m serving --port 0``) is found by the flows and the
MLflow plugin through the record it keeps in the state folder, with only ``TOLLFREE_HOME`` set; once it has
stopped, its record is gone and a failed call names ``TOLLFREE_GATEWAY_URL``. (tests/unit/test_discovery.py
holds the resolver's rules.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.gateway_api import GatewayApi, GatewayError
from serving.discovery import read_records, resolve_gateway
from serving.gateway.process import GatewayProcess
from serving.mlflow_plugin import TollfreeDeploymentClient
from serving.settings import PROJECT_DIR

pytestmark = pytest.mark.slow


def start_on_any_port(home: Path, log_path: Path, timeout_s: float = 120.0) -> GatewayProcess:
    """``python -m serving --port 0`` on ``home``, once its record names it (the URL read from the record)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TOLLFREE_GATEWAY_URL", "PREFECT_HOME")}
    env.update(
        {
            "TOLLFREE_HOME": str(home),
            "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
            "TOLLFREE_WARM_POOL": "0",
            "TOLLFREE_AUTOSCALE": "off",
        }
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(PROJECT_DIR),
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        mine = [record for _, record in read_records(home / "gateways") if record.pid == process.pid]
        if mine:
            return GatewayProcess(process, mine[0].url, log_path)
        assert process.poll() is None, f"the gateway exited with code {process.returncode}; see {log_path}"
        time.sleep(0.1)
    GatewayProcess(process, "", log_path).stop()
    raise AssertionError(f"the gateway recorded no URL in {timeout_s:.0f}s; see {log_path}")


def test_flows_find_a_gateway_on_another_port_by_its_record_and_name_the_variable_once_it_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    flows_env = {"TOLLFREE_HOME": str(home), "TOLLFREE_TOKEN": os.environ["TOLLFREE_TOKEN"]}  # no TOLLFREE_GATEWAY_URL
    gateway = start_on_any_port(home, tmp_path / "gateway.log")
    try:
        port = int(gateway.url.rsplit(":", 1)[1])
        assert port not in (0, 8080)
        api = GatewayApi.from_environ(flows_env)
        assert (api.url, api.address.source) == (gateway.url, "record")
        assert api.names() == []  # the control plane answered, with the admin token
        api.close()
        monkeypatch.delenv("TOLLFREE_GATEWAY_URL", raising=False)
        monkeypatch.setenv("TOLLFREE_HOME", str(home))
        assert TollfreeDeploymentClient("tollfree").list_deployments() == []
    finally:
        gateway.stop()
    assert read_records(home / "gateways") == []  # removed on the clean shutdown
    gone = resolve_gateway(flows_env, default=gateway.url)  # its port as the default: surely refused now
    assert gone.source == "default"
    with pytest.raises(GatewayError) as failed:
        GatewayApi(gone.url, flows_env["TOLLFREE_TOKEN"], address=gone).names()
    assert "TOLLFREE_GATEWAY_URL" in str(failed.value) and gateway.url in str(failed.value)
    assert str(home / "gateways") in str(failed.value)
