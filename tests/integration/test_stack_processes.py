"""The local stack's pieces that need no server: configuration, the admin token, and the process records
(with real child processes started and stopped)."""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

from infra.processes import MARK, marked, spawn, start_ticks, stop_pids, stop_record
from infra.services import child_environ, port_free, services
from infra.stack import write_env_file
from infra.stack_config import StackConfig, admin_token
from infra.stack_record import StackRecord


def test_ports_come_from_the_environment_and_are_checked(tmp_path: Path):
    config = StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_PREFECT_PORT": "14999"})
    assert config.ports == {"prefect": 14999, "mlflow": 5000, "gateway": 8080, "redis": 6380, "prometheus": 9090}
    assert config.prefect_api == "http://127.0.0.1:14999/api"
    with pytest.raises(ValueError, match="TOLLFREE_GATEWAY_PORT"):
        StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_GATEWAY_PORT": "80a"})


def test_a_database_gets_a_local_mlflow_server_in_front_and_a_remote_server_is_used_as_is(tmp_path: Path):
    local = StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path)})
    assert local.backend_store_uri == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    assert local.tracking_uri == "http://127.0.0.1:5000"
    remote = StackConfig.from_environ(
        {"TOLLFREE_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000"}
    )
    assert remote.backend_store_uri is None and remote.tracking_uri == "http://mlflow.internal:5000"
    postgres = StackConfig.from_environ(
        {"TOLLFREE_HOME": str(tmp_path), "MLFLOW_TRACKING_URI": "postgresql+psycopg2://mlflow@db.internal/mlflow"}
    )
    assert postgres.backend_store_uri == "postgresql+psycopg2://mlflow@db.internal/mlflow"
    assert postgres.tracking_uri == "http://127.0.0.1:5000"


def test_the_admin_token_is_generated_once_into_a_private_file(tmp_path: Path):
    config = StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path)})
    first = admin_token(config, {})
    assert len(first) >= 32
    assert stat.S_IMODE(config.token_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.token_file.parent.stat().st_mode) == 0o700
    assert admin_token(config, {}) == first
    given = {"TOLLFREE_HOME": str(tmp_path), "TOLLFREE_TOKEN": "from-the-environment-123"}
    assert admin_token(StackConfig.from_environ(given), given) == "from-the-environment-123"
    config.state_dir.mkdir(parents=True)
    write_env_file(config)
    env_file = config.env_file.read_text()
    assert first not in env_file and str(config.token_file) in env_file


def test_the_stacks_own_env_file_sourced_changes_nothing(tmp_path: Path):
    config = StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path)})
    token = admin_token(config, {})
    sourced = {
        "TOLLFREE_HOME": str(tmp_path),
        "MLFLOW_TRACKING_URI": config.tracking_uri,
        "TOLLFREE_TOKEN": token,
        "PREFECT_API_URL": config.prefect_api,
    }
    again = StackConfig.from_environ(sourced)
    assert again.backend_store_uri == config.backend_store_uri  # still our MLflow server, on our SQLite
    assert again.external_tracking_uri is None and not again.token_from_env


def test_a_taken_port_is_reported(tmp_path: Path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        assert not port_free(sock.getsockname()[1])


def test_stopping_a_record_stops_its_group_and_the_sweep_finds_marked_children(tmp_path: Path):
    stack_id = uuid.uuid4().hex
    env = {**os.environ, MARK: stack_id}
    # a parent that starts a child in a session of its own (as the gateway starts replicas), then waits
    script = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        "time.sleep(120)"
    )
    record = spawn("parent", [sys.executable, "-c", script], env, tmp_path / "parent.log", tmp_path)
    assert record.alive()
    found = []
    deadline = time.monotonic() + 60  # two Python start-ups on a busy machine
    while len(found) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
        found = marked(stack_id)
    assert {pid for pid, _ in found} >= {record.pid} and len(found) == 2
    assert stop_record(record, grace_s=5) is False  # it went on SIGTERM
    assert not record.alive()
    survivors = marked(stack_id)
    assert len(survivors) == 1  # the child left the group: only the mark finds it
    stop_pids(survivors, grace_s=5)
    assert marked(stack_id) == []


def test_a_recycled_pid_is_not_ours(tmp_path: Path):
    record = spawn("short", [sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "s.log", tmp_path)
    other = StackRecord("x", {"short": record})
    deadline = time.monotonic() + 60
    while record.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not other.services["short"].alive()
    assert start_ticks(os.getpid()) is not None
    fake = type(record)(name="me", pid=os.getpid(), start_ticks=start_ticks(os.getpid()) + 1, argv=[], log="")
    assert not fake.alive()  # same pid, another start time


def test_up_refuses_a_taken_port_before_starting_anything(tmp_path: Path):
    from infra.stack import up
    from serving.replicas.local import free_port

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        environ = {
            "TOLLFREE_HOME": str(tmp_path),
            "TOLLFREE_GATEWAY_PORT": str(sock.getsockname()[1]),
            "TOLLFREE_PREFECT_PORT": str(free_port()),
            "TOLLFREE_MLFLOW_PORT": str(free_port()),
            "TOLLFREE_SEED_DATA": "0",
            "PATH": os.environ["PATH"],
        }
        with pytest.raises(SystemExit, match="TOLLFREE_GATEWAY_PORT"):
            up(StackConfig.from_environ(environ), environ)
    assert not (tmp_path / "stack" / "stack.json").exists()


def test_one_gateway_by_default_and_with_several_postgresql_and_haproxy_in_front(tmp_path: Path):
    env = {
        "TOLLFREE_HOME": str(tmp_path),
        "TOLLFREE_GATEWAY_PORT": "18080",
        "MLFLOW_TRACKING_URI": "http://mlflow.x:5000",
    }
    one = services(StackConfig.from_environ(env), child_environ(StackConfig.from_environ(env), env, "s", "t" * 20))
    assert [s.name for s in one] == ["prefect-server", "redis", "gateway", "prometheus", "stream-feed", "worker"]
    assert one[2].port == 18080 and "TOLLFREE_STATE_URL" not in one[2].env
    assert one[1].port == 6380 and "--appendonly" in one[1].argv and one[4].env["TOLLFREE_REDIS_PORT"] == "6380"

    several = {**env, "TOLLFREE_GATEWAYS": "3", "TOLLFREE_POSTGRES_PORT": "15433"}
    config = StackConfig.from_environ(several)
    wanted = {s.name: s for s in services(config, child_environ(config, several, "s", "t" * 20))}
    assert list(wanted) == [
        "prefect-server",
        "redis",
        "postgres",
        "gateway-1",
        "gateway-2",
        "gateway-3",
        "haproxy",
        "prometheus",
        "stream-feed",
        "worker",
    ]
    assert [wanted[f"gateway-{i}"].port for i in (1, 2, 3)] == [18081, 18082, 18083]
    assert wanted["haproxy"].port == 18080 and wanted["postgres"].port == 15433
    password = (tmp_path / "secrets" / "postgres-password").read_text().strip()
    assert stat.S_IMODE((tmp_path / "secrets" / "postgres-password").stat().st_mode) == 0o600
    urls = {wanted[f"gateway-{i}"].env["TOLLFREE_STATE_URL"] for i in (1, 2, 3)}
    assert urls == {f"postgresql://tollfree:{password}@127.0.0.1:15433/tollfree"}
    assert password not in wanted["postgres"].url and "***" in wanted["postgres"].url
    wanted["haproxy"].prepare()
    cfg = (config.state_dir / "haproxy.cfg").read_text()
    assert "bind 127.0.0.1:18080" in cfg and "option httpchk GET /healthz" in cfg and "option redispatch 1" in cfg
    assert [line.split()[2] for line in cfg.splitlines() if line.strip().startswith("server ")] == [
        "127.0.0.1:18081",
        "127.0.0.1:18082",
        "127.0.0.1:18083",
    ]
    assert wanted["prometheus"].port == 9090 and "--web.listen-address=127.0.0.1:9090" in wanted["prometheus"].argv
    wanted["prometheus"].prepare()
    scrape_token = tmp_path / "secrets" / "scrape-token"
    assert scrape_token.read_text().strip() == "t" * 20 and stat.S_IMODE(scrape_token.stat().st_mode) == 0o600
    prometheus_cfg = (config.state_dir / "prometheus.yml").read_text()
    assert (
        "t" * 20 not in prometheus_cfg and str(tmp_path / "prometheus" / "targets" / "*.gateway.json") in prometheus_cfg
    )
    given = {**several, "TOLLFREE_STATE_URL": "postgresql://u:p@db.internal/s"}
    assert StackConfig.from_environ(given).postgres is None  # the user's PostgreSQL: none of the stack's own


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"TOLLFREE_GATEWAYS": "0"}, "TOLLFREE_GATEWAYS must be a whole number from 1 to 16"),
        ({"TOLLFREE_GATEWAYS": "two"}, "TOLLFREE_GATEWAYS must be a whole number"),
        ({"TOLLFREE_GATEWAYS": "2", "TOLLFREE_STATE_URL": "sqlite:///x.db"}, "needs a PostgreSQL state store"),
        ({"TOLLFREE_GATEWAYS": "2", "TOLLFREE_POSTGRES_PORT": "99999"}, "TOLLFREE_POSTGRES_PORT must be a TCP port"),
        ({"TOLLFREE_GATEWAYS": "4", "TOLLFREE_GATEWAY_PORT": "65533"}, "leaves no room for 4 gateways"),
    ],
)
def test_a_bad_gateway_setting_is_refused_naming_it(tmp_path: Path, env: dict, says: str):
    with pytest.raises(ValueError, match=says):
        StackConfig.from_environ({"TOLLFREE_HOME": str(tmp_path), **env})


def test_haproxy_accepts_the_configuration_make_up_writes(tmp_path: Path):
    import subprocess

    from infra import haproxy
    from infra.packages import ensure_haproxy

    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(haproxy.config(18080, [18081, 18082]))
    checked = subprocess.run([ensure_haproxy(), "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_haproxy_accepts_another_regions_gateways_as_backup_servers(tmp_path: Path, capsys: pytest.CaptureFixture):
    import subprocess

    from infra import haproxy
    from infra.packages import ensure_haproxy

    argv = [
        "--listen",
        "18080",
        "--gateway",
        "127.0.0.1:18081",
        "--backup",
        "10.1.0.2:8080",
        "--backup",
        "10.1.0.3:8080",
    ]
    assert haproxy.main(argv) == 0
    text = capsys.readouterr().out
    assert "server gateway-1 127.0.0.1:18081 check\n" in text and "option allbackups" in text
    assert "server backup-2 10.1.0.3:8080 check backup" in text
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(text)
    checked = subprocess.run([ensure_haproxy(), "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    with pytest.raises(SystemExit):
        haproxy.main(["--listen", "1", "--gateway", "nowhere"])
