"""The MLflow tracking server killed (-9) in the middle of a promotion: a real ``mlflow server`` over the
world's SQLite registry, the promote flow under Prefect's harness, the kill injected while the gates run.

What must hold: the flow run ends Failed with one message that names the registry's address and says no
alias moved; no alias and no gate tag changed (read straight from the database, and again through the
restarted server); a rerun against the restarted server completes.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import mlflow
import pytest
from mlflow import MlflowClient

from flows.promote import promote
from serving.registry import gates, lifecycle, versions
from serving.registry.errors import RegistryUnavailable
from serving.replicas.local import free_port
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

MODEL = "fraud_registry_down"
POLICY = """\
model: fraud_registry_down
endpoint: fraud
feature_service: fraud_v1
bootstrap_champion: false
gates:
  quality:
    min: {eval_pr_auc: 0.05, eval_roc_auc: 0.55}
  data: {require_success: true}
  compatibility: {require_signature: true}
"""


class MlflowServer:
    """``mlflow server`` on a free loopback port over an existing backend store; start, kill -9, start again."""

    def __init__(self, backend_store_uri: str, artifacts: Path, log: Path) -> None:
        self.backend_store_uri, self.artifacts, self.log = backend_store_uri, artifacts, log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 180.0) -> None:
        env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--backend-store-uri",
                    self.backend_store_uri,
                    "--artifacts-destination",
                    str(self.artifacts),
                    "--workers",
                    "1",
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                assert self.process.poll() is None, f"mlflow server exited during start-up; see {self.log}"
                try:
                    if client.get(f"{self.url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, f"mlflow server not healthy in {timeout_s:.0f}s; see {self.log}"
                time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL to the server's whole process group (the CLI and its uvicorn worker)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@pytest.fixture(scope="module")
def server(world, tmp_path_factory) -> Iterator[MlflowServer]:
    folder = tmp_path_factory.mktemp("mlflow-server")
    srv = MlflowServer(world.settings.tracking_uri, folder / "artifacts", folder / "server.log")
    srv.start()
    yield srv
    if srv.alive():
        srv.kill()


@pytest.fixture(scope="module")
def candidate(world) -> str:
    """A copy of the world's champion as the ``candidate`` of a model of its own (registered directly)."""
    mlflow.set_tracking_uri(world.settings.tracking_uri)
    direct = MlflowClient(world.settings.tracking_uri)
    champion = direct.get_model_version_by_alias(MODEL_NAME, "champion")
    version = str(mlflow.register_model(champion.source, MODEL).version)
    for key, value in champion.tags.items():
        direct.set_model_version_tag(MODEL, version, key, value)
    direct.set_registered_model_alias(MODEL, lifecycle.CANDIDATE, version)
    return version


def test_mlflow_killed_mid_promotion_fails_the_run_clearly_and_moves_nothing(
    world, server, candidate, tmp_path, monkeypatch, restore_tracking_uri
):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    direct = MlflowClient(world.settings.tracking_uri)
    aliases_before = versions.aliases(direct, MODEL)
    tags_before = dict(direct.get_model_version(MODEL, candidate).tags)
    assert aliases_before == {lifecycle.CANDIDATE: candidate}

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # the flow's own task retries (1, 2, 4 s) remain
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    real_data_gate = gates.data_gate
    killed: list[float] = []

    def data_gate_then_kill(cfg, tags):  # type: ignore[no-untyped-def]
        # the quality gate has read the registry and the model through the server; the results are not yet recorded
        server.kill()
        killed.append(time.monotonic())
        return real_data_gate(cfg, tags)

    monkeypatch.setattr(gates, "data_gate", data_gate_then_kill)
    with pytest.raises(RegistryUnavailable) as failure:
        promote(model_name=MODEL, policy_file=str(policy))
    assert killed, "the fault was never injected"
    message = str(failure.value)
    assert f"127.0.0.1:{server.port}" in message and "no alias moved" in message and MODEL in message

    # the run is Failed in Prefect, with the same message
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async def last_run() -> tuple[str, str]:
        async with get_client() as client:
            # the harness is shared by the whole session: ask for the latest promote runs, not any 50 (ids are random)
            runs = await client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["promote"])),
                sort=FlowRunSort.START_TIME_DESC,
                limit=10,
            )
            mine = [r for r in runs if r.state and f"127.0.0.1:{server.port}" in (r.state.message or "")]
            assert mine, "no flow run names the unreachable registry"
            return mine[0].state.type.value, mine[0].state.message

    state, state_message = asyncio.run(last_run())
    assert state == "FAILED" and "no alias moved" in state_message

    # nothing changed: straight from the database, then through the restarted server
    assert versions.aliases(direct, MODEL) == aliases_before
    assert dict(direct.get_model_version(MODEL, candidate).tags) == tags_before
    server.start()
    through_server = MlflowClient(server.url)
    assert versions.aliases(through_server, MODEL) == aliases_before

    # the same promotion, rerun with the server back, completes
    monkeypatch.setattr(gates, "data_gate", real_data_gate)
    done = promote(model_name=MODEL, policy_file=str(policy))
    assert done["alias"] == lifecycle.CHALLENGER
    assert versions.aliases(direct, MODEL) == {lifecycle.CHALLENGER: candidate}
    assert direct.get_model_version(MODEL, candidate).tags["gate.quality"] == "pass"
