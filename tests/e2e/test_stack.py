"""``make up`` / ``make status`` / ``make down`` for real, on free ports and a throw-away state folder.

up -> the Prefect API lists every deployment with its schedule, the UIs answer -> a deployment run
triggered from the Prefect CLI completes and shows its artifact -> status says what runs -> down ->
no process of ours is left (recorded pids, and everything carrying the stack's mark).
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from infra.processes import marked, start_ticks
from serving.replicas.local import free_port

PROJECT_DIR = Path(__file__).resolve().parents[2]
PREFECT = str(Path(os.sys.executable).parent / "prefect")


def _stack_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in {"MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL", "TOLLFREE_TOKEN", "TOLLFREE_TOKENS_FILE"}}
    env.update({
        "TOLLFREE_HOME": str(home),
        "TOLLFREE_PREFECT_PORT": str(free_port()),
        "TOLLFREE_MLFLOW_PORT": str(free_port()),
        "TOLLFREE_GATEWAY_PORT": str(free_port()),
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    })
    return env


def _make(target: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", target], cwd=PROJECT_DIR, env=env, capture_output=True,
                          text=True, timeout=timeout)


def _small_data(home: Path) -> None:
    from feature_repo import synthetic

    start = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=10)
    synthetic.write(synthetic.generate(synthetic.SyntheticConfig(n_customers=150, n_merchants=30, days=10, seed=3,
                                                                 start=start)), home / "data")


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_up_registers_every_deployment_runs_one_from_the_cli_and_down_leaves_nothing(tmp_path: Path):
    home = tmp_path / "home"
    _small_data(home)  # a small data set: make up seeds the demo's only when there is none
    env = _stack_env(home)
    api = f"http://127.0.0.1:{env['TOLLFREE_PREFECT_PORT']}/api"
    record_path = home / "stack" / "stack.json"
    started = time.monotonic()
    try:
        up = _make("up", env)
        print(f"make up: {time.monotonic() - started:.0f}s")
        assert up.returncode == 0, up.stdout + up.stderr
        token_file = home / "secrets" / "admin-token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert str(token_file) in up.stdout and token not in up.stdout + up.stderr
        assert not any(token in p.read_text(errors="replace") for p in (home / "logs").glob("*.log"))

        with httpx.Client(timeout=10) as client:
            flows = {f["id"]: f["name"] for f in client.post(f"{api}/flows/filter", json={}).json()}
            deployments = {f"{flows[d['flow_id']]}/{d['name']}": d for d in client.post(f"{api}/deployments/filter", json={}).json()}
            crons = {name: [s["schedule"].get("cron") for s in d["schedules"]] for name, d in deployments.items()}
            assert crons["materialize/hourly"] == ["0 * * * *"]
            assert crons["train/nightly-fraud"] == ["0 2 * * *"]
            assert crons["skew-drift-all/hourly"] == ["0 * * * *"]  # every endpoint the gateway serves
            assert crons["batch-score/daily"] == ["0 5 * * *"]
            assert crons["canary-all/every-5-minutes"] == ["*/5 * * * *"]
            assert crons["labels/daily"] == ["0 5 * * *"]
            assert "promote/after-training-fraud" in deployments
            assert all(d["work_pool_name"] == "tollfree-local" for d in deployments.values())
            automations = client.post(f"{api}/automations/filter", json={}).json()
            assert any(a["name"] == "promote-fraud-after-training" and a["enabled"] for a in automations)
            ui = client.get(api.removesuffix("/api") + "/")
            assert ui.status_code == 200 and "<html" in ui.text.lower()
            mlflow_ui = client.get(f"http://127.0.0.1:{env['TOLLFREE_MLFLOW_PORT']}/")
            assert mlflow_ui.status_code == 200

        cli_env = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(home / "prefect")}
        run = subprocess.run([PREFECT, "deployment", "run", "materialize/hourly", "--watch", "--watch-interval", "2",
                              "--watch-timeout", "240"], env=cli_env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        print(f"deployment run done at {time.monotonic() - started:.0f}s")
        with httpx.Client(timeout=10) as client:
            runs = client.post(f"{api}/flow_runs/filter", json={
                "deployments": {"id": {"any_": [deployments["materialize/hourly"]["id"]]}}}).json()
            [done] = [r for r in runs if r["state_type"] == "COMPLETED"]
            artifacts = client.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [done["id"]]}}}).json()
        assert [a["key"] for a in artifacts] == ["materialize-summary"]
        assert {row["table"] for row in json.loads(artifacts[0]["data"])} >= {"customer_activity"}

        status = _make("status", env)
        assert status.returncode == 0, status.stdout + status.stderr
        for name in ("prefect-server", "mlflow-server", "gateway", "worker"):
            assert any(line.split()[:1] == [name] and "running" in line for line in status.stdout.splitlines()), status.stdout
        assert "materialize/hourly" in status.stdout and "0 2 * * *" in status.stdout

        record = json.loads(record_path.read_text())
        recorded = [(s["pid"], s["start_ticks"]) for s in record["services"]]
        assert len(recorded) == 4
    finally:
        if record_path.exists():
            down = _make("down", env)
            print(f"make down done at {time.monotonic() - started:.0f}s")
            assert down.returncode == 0, down.stdout + down.stderr
    assert all(start_ticks(pid) != ticks for pid, ticks in recorded)
    assert marked(record["stack_id"]) == []
    after = subprocess.run([os.sys.executable, "-m", "infra.stack", "status"], cwd=PROJECT_DIR, env=env,
                           capture_output=True, text=True, timeout=60)
    assert after.returncode == 3 and "not running" in after.stdout
    assert (home / "prefect" / "prefect.db").exists() and (home / "mlflow.db").exists()  # state survives down
