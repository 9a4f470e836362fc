"""Entry points refuse bad set-up with a clear message and a non-zero exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[2]


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_gateway_refuses_to_start_without_an_admin_token(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TOLLFREE_TOKEN"} | {"TOLLFREE_HOME": str(tmp_path)}
    result = run(["serving", "--port", "1"], env)
    assert result.returncode == 2 and "TOLLFREE_TOKEN" in result.stderr


@pytest.mark.parametrize("value", ["soon", "0"])
def test_the_gateway_refuses_a_request_timeout_that_is_not_a_sane_number_of_seconds(tmp_path, value):
    env = dict(os.environ) | {"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_REQUEST_TIMEOUT_S": value}
    result = run(["serving", "--port", "1"], env)
    assert result.returncode == 2 and "TOLLFREE_REQUEST_TIMEOUT_S" in result.stderr and "(0, 3600]" in result.stderr


def test_the_gateway_refuses_a_replica_host_it_cannot_listen_on(tmp_path):
    env = dict(os.environ) | {"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_REPLICA_HOST": "192.0.2.1"}  # TEST-NET-1
    result = run(["serving", "--port", "1"], env)
    assert result.returncode == 2 and "TOLLFREE_REPLICA_HOST='192.0.2.1'" in result.stderr


def test_lineage_of_an_unknown_alias_exits_2_naming_it(world):
    result = run(["flows.lineage", "--model", "fraud", "--ref", "nope"], dict(os.environ))
    assert result.returncode == 2 and "'nope'" in result.stdout


def test_training_without_data_names_the_missing_file(tmp_path):
    env = dict(os.environ) | {"TOLLFREE_HOME": str(tmp_path / "empty")}
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("PREFECT_HOME", None)
    result = run(["flows.train"], env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "training refused" in result.stderr and "transactions.parquet" in result.stderr
    assert "customers.parquet" in result.stderr and "materialize" in result.stderr  # every missing input named
    assert not (tmp_path / "empty" / "mlflow.db").exists()  # refused before the registry was opened


@pytest.mark.parametrize(
    ("args", "grpc_env", "named"),
    [
        (["--port", "1"], "soon", "the gRPC port (--grpc-port or TOLLFREE_GRPC_PORT) must be a port number"),
        (["--port", "1", "--grpc-port", "1"], None, "--grpc-port must differ from --port"),
    ],
)
def test_the_gateway_refuses_a_grpc_port_it_cannot_use(tmp_path, args, grpc_env, named):
    env = dict(os.environ) | {"TOLLFREE_HOME": str(tmp_path)}
    if grpc_env is not None:
        env["TOLLFREE_GRPC_PORT"] = grpc_env
    result = run(["serving", *args], env)
    assert result.returncode == 2 and named in result.stderr


def test_a_gateway_whose_grpc_port_is_taken_stops_naming_it(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ) | {"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_GRPC_PORT": str(port)}
        result = run(["serving", "--port", "0"], env)
    assert result.returncode != 0 and f"the gRPC port 127.0.0.1:{port} is in use" in result.stdout + result.stderr
