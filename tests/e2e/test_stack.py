"""``make up`` / ``make status`` / ``make down`` for real, on free ports and a throw-away state folder, with
``TOLLFREE_GATEWAYS=2``: the stack's own PostgreSQL, two gateways and HAProxy in front of them.

up -> the Prefect API lists every deployment with its schedule, the UIs answer -> a deployment run triggered
from the Prefect CLI completes and shows its artifact, while an endpoint created through HAProxy comes up and
answers and the demo's stream feed reaches it -> Prometheus scrapes both gateways and the endpoint's replica and
records the endpoint's rate -> status says what runs (the stream with its lag) -> down -> no
process of ours is left (recorded pids, and everything carrying the stack's mark) -> up again: the endpoint, its
config and alias, and the token are back -> down.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import redis

from infra.processes import marked, start_ticks
from infra.services import port_free
from serving.gateway.process import wait_endpoint_ready
from serving.replicas.local import free_port

PROJECT_DIR = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")


def _free_ports(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports (HAProxy's, then one per gateway)."""
    for _ in range(100):
        base = free_port()
        if base + n < 65536 and all(port_free(base + i) for i in range(1, n)):
            return base
    raise AssertionError(f"no {n} consecutive free ports")


def _stack_env(home: Path, postgres_dir: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "MLFLOW_TRACKING_URI",
            "PREFECT_HOME",
            "PREFECT_API_URL",
            "TOLLFREE_TOKEN",
            "TOLLFREE_TOKENS_FILE",
            "TOLLFREE_STATE_URL",
        }
    }
    env.update(
        {
            "TOLLFREE_HOME": str(home),
            "TOLLFREE_PREFECT_PORT": str(free_port()),
            "TOLLFREE_MLFLOW_PORT": str(free_port()),
            "TOLLFREE_GATEWAY_PORT": str(_free_ports(3)),
            "TOLLFREE_GATEWAYS": "2",
            "TOLLFREE_POSTGRES_PORT": str(free_port()),
            "TOLLFREE_REDIS_PORT": str(free_port()),
            "TOLLFREE_PROMETHEUS_PORT": str(free_port()),
            "TOLLFREE_STREAM_RATE": "20",
            "TOLLFREE_STREAM_ENDPOINT": "tiny",  # the feed attaches its stream to the test's endpoint
            "TOLLFREE_POSTGRES_DIR": str(postgres_dir),  # PostgreSQL runs as its own user: not under pytest's 0700 tmp
            "TOLLFREE_WARM_POOL": "0",
            "PREFECT_WORKER_QUERY_SECONDS": "2",
            # The deployments keep their schedules (checked below), but the server makes no runs of them: with its
            # scheduler on, the stack's worker starts a canary-all run whenever the test crosses a 5-minute mark
            # (the hour adds materialize and skew-drift-all), each a flow process beside the test's own steps, so the
            # test's length and CPU would depend on the clock. The deployment run the test needs, it triggers itself.
            "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "false",
        }
    )
    return env


def _log_tiny_model(tracking_uri: str) -> None:
    """A small scikit-learn model registered in the stack's own MLflow server, alias ``champion``."""
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient
    from mlflow.models import infer_signature
    from sklearn.linear_model import LogisticRegression

    x = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0] * 10, "b": [1.0, 0.0, 1.0, 0.0] * 10})
    y = (x["a"] > 1.5).astype(int)
    model = LogisticRegression().fit(x, y)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("stack-test")
    with mlflow.start_run():
        mlflow.sklearn.log_model(
            model,
            name="model",
            signature=infer_signature(x, model.predict(x)),
            registered_model_name="tiny",
            pip_requirements=["mlflow", "scikit-learn"],
        )
    MlflowClient(tracking_uri).set_registered_model_alias("tiny", "champion", "1")


def _served(gateway: str, token: str) -> dict:
    """The endpoint ``tiny`` once ready, after a prediction through it answered."""
    ready = wait_endpoint_ready(gateway, token, "tiny", timeout_s=240)
    answer = httpx.post(
        f"{gateway}/serving-endpoints/tiny/invocations",
        timeout=60,
        headers={"Authorization": f"Bearer {token}"},
        json={"dataframe_records": [{"a": 3.0, "b": 0.0}, {"a": 0.0, "b": 1.0}]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == [1, 0]
    return ready


def _make(target: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", target],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _small_data(home: Path) -> None:
    from feature_repo import synthetic

    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=10)
    synthetic.write(
        synthetic.generate(synthetic.SyntheticConfig(n_customers=150, n_merchants=30, days=10, seed=3, start=start)),
        home / "data",
    )


def _secrets_kept(home: Path, up: subprocess.CompletedProcess[str]) -> str:
    """The admin token, after checking it and the PostgreSQL password are files of mode 0600 shown nowhere."""
    token_file = home / "secrets" / "admin-token"
    token = token_file.read_text().strip()
    password_file = home / "secrets" / "postgres-password"
    password = password_file.read_text().strip()
    logs = [p.read_text(errors="replace") for p in (home / "logs").glob("*.log")]
    for secret, path in ((token, token_file), (password, password_file)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert secret not in up.stdout + up.stderr and not any(secret in log for log in logs), path.name
    assert str(token_file) in up.stdout and "HAProxy over 2 gateways" in up.stdout
    return token


def _deployments_registered(api: str, mlflow_port: str) -> dict[str, dict]:
    """Every deployment with its schedule and work pool, the promotion's automation, and both UIs answering."""
    with httpx.Client(timeout=10) as client:
        flows = {f["id"]: f["name"] for f in client.post(f"{api}/flows/filter", json={}).json()}
        deployments = {
            f"{flows[d['flow_id']]}/{d['name']}": d for d in client.post(f"{api}/deployments/filter", json={}).json()
        }
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
        assert client.get(f"http://127.0.0.1:{mlflow_port}/").status_code == 200
    return deployments


def _run_deployment(env: dict[str, str], api: str, home: Path, output: Path) -> subprocess.Popen[bytes]:
    """``prefect deployment run materialize/hourly --watch`` in the background, its output to ``output``: the
    stack's worker runs it in a flow process while the test goes on with the endpoint (both take tens of seconds,
    mostly waiting)."""
    cli_env = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(home / "prefect")}
    watch = ["--watch", "--watch-interval", "2", "--watch-timeout", "240"]
    with open(output, "wb") as out:
        return subprocess.Popen(
            [PREFECT, "deployment", "run", "materialize/hourly", *watch], env=cli_env, stdout=out, stderr=out
        )


def _deployment_run_done(run: subprocess.Popen[bytes], output: Path, api: str, deployment: dict) -> None:
    """The CLI's run completed, and its flow run shows the materialization's artifact."""
    try:
        run.wait(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, output.read_text(errors="replace")[-6000:]
    with httpx.Client(timeout=10) as client:
        runs = client.post(f"{api}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment["id"]]}}}).json()
        completed = [r for r in runs if r["state_type"] == "COMPLETED"]
        assert completed, runs
        artifacts = client.post(
            f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [completed[0]["id"]]}}}
        ).json()
    assert [a["key"] for a in artifacts] == ["materialize-summary"]
    assert {row["table"] for row in json.loads(artifacts[0]["data"])} >= {"customer_activity"}


def _endpoint_created(gateway: str, token: str) -> None:
    created = httpx.post(
        f"{gateway}/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
        json={
            "name": "tiny",
            "config": {"served_entities": [{"entity_name": "tiny", "entity_alias": "champion", "max_concurrency": 3}]},
        },
    )
    assert created.status_code == 200, created.text


def _feed_dead_lettered(redis_port: str) -> None:
    """The feed attached its stream to ``tiny``: the demo's transactions lack tiny's columns, so each one is consumed
    and dead-lettered with the missing column named (the feed, the broker and the consumer work)."""
    broker = redis.Redis(port=int(redis_port))
    deadline = time.monotonic() + 120
    while not broker.exists("transactions-dead"):
        assert time.monotonic() < deadline, "no event of the feed reached the dead-letter stream"
        time.sleep(0.5)
    letter = broker.xrange("transactions-dead", count=1)[0][1]
    assert letter[b"reason"].startswith(b"INVALID_PARAMETER_VALUE: event is missing field"), letter


def _status_lists_what_runs(env: dict[str, str], home: Path) -> None:
    status = _make("status", env)
    assert status.returncode == 0, status.stdout + status.stderr
    services = (
        "prefect-server",
        "mlflow-server",
        "redis",
        "postgres",
        "gateway-1",
        "gateway-2",
        "haproxy",
        "prometheus",
    )
    for name in (*services, "stream-feed", "worker"):
        assert any(line.split()[:1] == [name] and "running" in line for line in status.stdout.splitlines()), (
            status.stdout
        )
    assert "materialize/hourly" in status.stdout and "0 2 * * *" in status.stdout
    password = (home / "secrets" / "postgres-password").read_text().strip()
    assert "tiny" in status.stdout and password not in status.stdout
    assert "/transactions -> scores  group tollfree: lag" in status.stdout, status.stdout
    roles = [(home / "logs" / f"gateway-{i}.log").read_text() for i in (1, 2)]
    assert sum("leading (" in log for log in roles) == 1 and sum("following the leader" in log for log in roles) == 1


def _prometheus_scrapes(env: dict[str, str]) -> None:
    """Prometheus scrapes both gateways and the endpoint's replica (the lists the gateways keep), its recording
    rules give the endpoint's request rate, and it has loaded the alerting rules."""
    url = f"http://127.0.0.1:{env['TOLLFREE_PROMETHEUS_PORT']}/api/v1"
    deadline = time.monotonic() + 90
    while True:
        targets = httpx.get(f"{url}/targets", timeout=10).json()["data"]["activeTargets"]
        up = sorted((t["labels"]["job"], t["labels"].get("endpoint", "")) for t in targets if t["health"] == "up")
        rate = httpx.get(f"{url}/query", params={"query": 'endpoint:tollfree_requests:rate1m{endpoint="tiny"}'}).json()
        if (
            up == [("tollfree-gateway", ""), ("tollfree-gateway", ""), ("tollfree-replica", "tiny")]
            and rate["data"]["result"]
        ):
            break
        assert time.monotonic() < deadline, (
            f"Prometheus: targets {[(t['labels'], t['health'], t.get('lastError')) for t in targets]}, rate {rate}"
        )
        time.sleep(1.0)
    rules = httpx.get(f"{url}/rules", params={"type": "alert"}, timeout=10).json()["data"]["groups"]
    alerts = {rule["name"] for group in rules for rule in group["rules"]}
    assert {
        "TollfreeLatencyOverSLO",
        "TollfreeErrorRate",
        "TollfreeReplicasAtMax",
        "TollfreeDriftFound",
        "TollfreeCanaryRolledBack",
        "TollfreeGatewayDown",
    } <= alerts


def _down_leaves_nothing(env: dict[str, str], home: Path) -> None:
    """``make down`` stops every recorded process and everything carrying the stack's mark; the state stays."""
    record = json.loads((home / "stack" / "stack.json").read_text())
    recorded = [(s["pid"], s["start_ticks"]) for s in record["services"]]
    assert len(recorded) == 10
    down = _make("down", env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert all(start_ticks(pid) != ticks for pid, ticks in recorded)
    assert marked(record["stack_id"]) == []  # replicas included
    after = subprocess.run(
        [sys.executable, "-m", "infra.stack", "status"],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert after.returncode == 3 and "not running" in after.stdout
    assert (home / "prefect" / "prefect.db").exists() and (home / "mlflow.db").exists()  # state survives down


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_up_with_two_gateways_registers_every_deployment_serves_and_comes_back_after_down(
    tmp_path: Path, restore_tracking_uri
):
    home = tmp_path / "home"
    _small_data(home)  # a small data set: make up seeds the demo's only when there is none
    postgres_dir = Path(tempfile.mkdtemp(prefix="tollfree-stack-pg-"))
    env = _stack_env(home, postgres_dir)
    gateway = f"http://127.0.0.1:{env['TOLLFREE_GATEWAY_PORT']}"
    api = f"http://127.0.0.1:{env['TOLLFREE_PREFECT_PORT']}/api"
    record_path = home / "stack" / "stack.json"
    started = time.monotonic()
    run: subprocess.Popen[bytes] | None = None
    run_output = tmp_path / "deployment-run.log"
    try:
        up = _make("up", env)
        print(f"make up: {time.monotonic() - started:.0f}s")
        assert up.returncode == 0, up.stdout + up.stderr
        token = _secrets_kept(home, up)
        deployments = _deployments_registered(api, env["TOLLFREE_MLFLOW_PORT"])

        run = _run_deployment(env, api, home, run_output)  # meanwhile: the endpoint
        _log_tiny_model(f"http://127.0.0.1:{env['TOLLFREE_MLFLOW_PORT']}")
        _endpoint_created(gateway, token)
        _served(gateway, token)
        print(f"endpoint served through HAProxy at {time.monotonic() - started:.0f}s")
        _feed_dead_lettered(env["TOLLFREE_REDIS_PORT"])
        before = wait_endpoint_ready(gateway, token, "tiny")  # its config now has the stream input: compared after up
        assert before["config"]["stream_inputs"][0]["source"].endswith("/transactions")
        _deployment_run_done(run, run_output, api, deployments["materialize/hourly"])
        print(f"deployment run done at {time.monotonic() - started:.0f}s")
        _prometheus_scrapes(env)

        _status_lists_what_runs(env, home)
        _down_leaves_nothing(env, home)

        again = _make("up", env)  # PostgreSQL, both gateways and HAProxy again, on the data they left
        assert again.returncode == 0, again.stdout + again.stderr
        back = _served(gateway, token)
        print(f"endpoint back after down and up at {time.monotonic() - started:.0f}s")
    finally:
        if run is not None and run.poll() is None:
            run.kill()
        if record_path.exists():
            down = _make("down", env)
            print(f"make down done at {time.monotonic() - started:.0f}s")
            assert down.returncode == 0, down.stdout + down.stderr
        shutil.rmtree(postgres_dir, ignore_errors=True)
    assert back["config"] == before["config"] and back["id"] == before["id"]
    assert back["config"]["served_entities"][0]["entity_alias"] == "champion"
