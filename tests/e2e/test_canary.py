"""The canary flow on a live gateway with real replicas, the real registry and Prefect's harness.

A slow challenger and one that fails on some inputs are rolled back by the flow alone while a client
keeps sending requests; a good challenger walks 5 -> 25 -> 50 -> 100 % and becomes ``champion``. A
registered model of its own, so other tests' champion never moves.
"""

from __future__ import annotations

import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from mlflow.models import infer_signature

from feature_repo import synthetic
from flows.canary import canary
from flows.labels import ingest_labels
from serving.gateway.process import wait_endpoint_ready
from serving.inference_log import read_inference_log
from serving.registry import versions
from serving.registry.canary_store import load_state
from tests.models import FlakyModel, SleepyModel
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

MODEL = "fraud_canary"
ENDPOINT = "canary"
THRESHOLDS = {"min_requests": 30, "min_error_requests": 20, "min_labelled": 20, "bootstrap": 300}


@dataclass
class Sent:
    request_id: str
    started: datetime
    status: int
    served_by: str | None
    predictions: list | None = None


@dataclass
class Traffic:
    """A client sending one request after another until stopped, recording every answer."""

    url: str
    token: str
    rows: list[dict]
    sent: list[Sent] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60) as client:
            i = 0
            while not self.stop.is_set():
                row = self.rows[i % len(self.rows)]
                request_id = f"cn-{i}-{time.monotonic_ns()}"
                started = datetime.now(UTC)
                try:
                    reply = client.post(
                        f"/serving-endpoints/{ENDPOINT}/invocations",
                        json={"dataframe_records": [row]},
                        headers={"x-request-id": request_id},
                    )
                    status, served = reply.status_code, reply.headers.get("served-model-name")
                    predictions = reply.json().get("predictions") if status == 200 else None
                except httpx.TransportError:
                    status, served, predictions = -1, None, None
                self.sent.append(Sent(request_id, started, status, served, predictions))
                i += 1

    def wait_for(self, which, count: int, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
        """Until ``count`` answers match ``which`` (the client keeps sending meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while sum(1 for s in list(self.sent) if which(s)) < count:
            assert time.monotonic() < deadline, f"fewer than {count} matching answers within {timeout_s:.0f} s"
            time.sleep(0.2)

    def __enter__(self) -> Traffic:
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


@pytest.fixture(scope="module")
def client(world) -> MlflowClient:
    return MlflowClient(world.settings.tracking_uri)


@pytest.fixture(scope="module")
def models(world, client) -> dict[str, str]:
    """Versions of MODEL: the champion (a copy of the world's), a good, a slow and a flaky challenger."""
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    feature_service = champion.tags["feature_service"]

    def copy() -> str:
        version = str(mlflow.register_model(champion.source, MODEL).version)
        client.set_model_version_tag(MODEL, version, "feature_service", feature_service)
        return version

    out = {"champion": copy(), "good": copy()}
    client.set_registered_model_alias(MODEL, "champion", out["champion"])
    inner = f"models:/{MODEL_NAME}/{champion.version}"
    with tempfile.TemporaryDirectory() as tmp:
        frame = pd.read_parquet(client.download_artifacts(champion.run_id, "evaluation/eval.parquet", tmp))
    schema = mlflow.models.get_model_info(inner).signature
    inputs = frame[schema.inputs.input_names()].head(5)
    outputs = mlflow.pyfunc.load_model(inner).predict(inputs)
    experiment = client.get_run(champion.run_id).info.experiment_id
    for key, python_model in (("slow", SleepyModel(0.05)), ("flaky", FlakyModel())):
        with mlflow.start_run(experiment_id=experiment):
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=python_model,
                artifacts={"inner": inner},
                signature=infer_signature(inputs, outputs),
                registered_model_name=MODEL,
                pip_requirements=["mlflow", "scikit-learn"],
                metadata={"feature_service": feature_service},
            )
        out[key] = str(info.registered_model_version)
        client.set_model_version_tag(MODEL, out[key], "feature_service", feature_service)
    return out


@pytest.fixture(scope="module")
def endpoint(world, gateway, models):
    with gateway.client(gateway.admin) as api:
        created = api.post(
            "/api/2.0/serving-endpoints",
            json={
                "name": ENDPOINT,
                "config": {
                    # a fixed per-replica concurrency: the vertical autoscaler's state (it re-tunes each side from its
                    # own history) would otherwise differ between champion and challenger and confound the latency check
                    "served_entities": [{"entity_name": MODEL, "entity_alias": "champion", "max_concurrency": 32}]
                },
            },
        )
        assert created.status_code == 200, created.text
    wait_endpoint_ready(gateway.url, gateway.admin, ENDPOINT)
    yield ENDPOINT
    with gateway.client(gateway.admin) as api:
        api.delete(f"/api/2.0/serving-endpoints/{ENDPOINT}")


@pytest.fixture(scope="module")
def rows(world) -> list[dict]:
    tx = synthetic.read_transactions(world.settings.data_dir).sample(400, random_state=21)
    return tx[["customer_id", "merchant_id", "amount"]].to_dict(orient="records")


def _run(gateway, **kwargs) -> dict:
    # a warning holds a step for 10 s here (30 min by default): a copy of the champion at a 5 % share is
    # measured slower than the busy champion (an idle replica runs cold), so a good canary warns on p50.
    # A bad challenger's test holds a warning as long as it takes (a loaded machine sends fewer requests
    # to the 5 % side: 1 error in 35 requests is a warning, not yet a rollback, and must not move on)
    kwargs.setdefault("max_warn_hold_s", 10)
    return canary(
        endpoint=ENDPOINT,
        thresholds=kwargs.pop("thresholds", THRESHOLDS),
        min_dwell_s=0,
        drain_s=0,
        gateway_url=gateway.url,
        **kwargs,
    )


def _until(gateway, done, runs: int = 90, **kwargs) -> list[dict]:
    """Run the flow until ``done(outcome)``; between holds, let traffic accumulate a little."""
    outcomes = []
    for _ in range(runs):
        outcomes.append(_run(gateway, **kwargs))
        if done(outcomes[-1]):
            return outcomes
        time.sleep(1.0)
    raise AssertionError(f"canary never reached its end: {[(o['action'], o['reason']) for o in outcomes[-5:]]}")


def logged_all(world, request_ids: list[str], timeout_s: float = 30.0) -> None:
    """Until every one of ``request_ids`` is in the endpoint's inference log."""
    deadline = time.monotonic() + timeout_s
    while True:
        log = read_inference_log(world.settings.inference_log_dir, endpoint=ENDPOINT)
        missing = set(request_ids) - set(log["request_id"])
        if not missing:
            return
        assert time.monotonic() < deadline, f"{len(missing)} answered requests not in the inference log"
        time.sleep(0.3)


def _view(gateway) -> dict:
    with gateway.client(gateway.admin) as api:
        return api.get(f"/api/2.0/serving-endpoints/{ENDPOINT}").json()


def _routes(view: dict) -> dict[str, int]:
    return {r["served_entity_name"]: r["traffic_percentage"] for r in view["config"]["traffic_config"]["routes"]}


def _rolls_back(gateway, client, world, models, rows, which: str, metric: str) -> list[Sent]:
    client.set_registered_model_alias(MODEL, "challenger", models[which])
    champion_before = versions.aliases(client, MODEL)["champion"]
    served_before = [e["name"] for e in _view(gateway)["config"]["served_entities"]]
    with Traffic(gateway.url, gateway.admin, rows) as traffic:
        started = _run(gateway)
        assert started["action"] == "started" and started["traffic"] == 5, started
        challenger = load_state(world.settings, ENDPOINT).challenger_entity
        outcomes = _until(gateway, lambda o: o["action"] != "hold", max_warn_hold_s=600)
        rolled_back_at = datetime.now(UTC)
        traffic.wait_for(lambda s: s.started > rolled_back_at, 12)  # traffic keeps flowing after the rollback
        cleaned = _run(gateway)  # the challenger leaves the endpoint while requests keep coming
        cleaned_at = datetime.now(UTC)
        traffic.wait_for(lambda s: s.started > cleaned_at, 10)
    final = outcomes[-1]
    assert final["action"] == "rollback" and final["event"] == "tollfree.canary.rollback", final
    assert (
        metric in final["reason"] and next(c for c in final["checks"] if c["metric"] == metric)["status"] == "rollback"
    )
    assert cleaned["action"] == "cleaned"
    view = _view(gateway)
    assert [e["name"] for e in view["config"]["served_entities"]] == served_before
    held = versions.aliases(client, MODEL)
    assert "challenger" not in held and held["champion"] == champion_before
    assert client.get_model_version(MODEL, models[which]).tags["canary.status"] == "rolled_back"
    state = load_state(world.settings, ENDPOINT)
    assert state.status == "rolled_back" and state.cleaned

    sent = traffic.sent
    assert sum(s.started > rolled_back_at for s in sent) > 20
    after = [s for s in sent if s.started > rolled_back_at]
    assert {s.status for s in after} == {200} and {s.served_by for s in after} == set(served_before)
    failed = [s for s in sent if s.status != 200]
    if failed:  # only the challenger's own 500s, before the rollback: none from the rollback itself
        assert {s.status for s in failed} == {500}
        log = read_inference_log(world.settings.inference_log_dir, endpoint=ENDPOINT).set_index("request_id")
        assert set(log.loc[[s.request_id for s in failed], "served_entity"]) == {challenger}
        assert max(s.started for s in failed) < rolled_back_at
    return sent


def test_a_slow_challenger_is_rolled_back_and_no_request_fails(world, gateway, client, models, endpoint, rows):
    sent = _rolls_back(gateway, client, world, models, rows, "slow", "p99_latency")
    assert {s.status for s in sent} == {200}


def test_a_challenger_failing_on_some_inputs_is_rolled_back(world, gateway, client, models, endpoint, rows):
    sent = _rolls_back(gateway, client, world, models, rows, "flaky", "error_rate")
    assert any(s.status == 500 for s in sent)  # it did fail, on the challenger, before the rollback


# A good challenger's latency is judged on a handful of requests (its 5 % share: 30 at least), so a neighbour's
# burst can make it look slower than the champion: with three test workers beside it, it measured
# 56.5 ms p99 against 9.4 and was rolled back at the default thresholds. This test is about the walk to 100, the
# delayed labels and the promotion, so it tolerates up to 10x the champion's latency (no hold, no rollback) and
# shares the machine; the latency rollback at the default thresholds is the slow challenger's test above.
SHARED_MACHINE = {**THRESHOLDS, "p99_warn": 9.0, "p99_rollback": 9.0, "p50_warn": 9.0}


def test_a_good_challenger_walks_to_100_and_becomes_champion(world, gateway, client, models, endpoint, rows, tmp_path):
    old = versions.aliases(client, MODEL)["champion"]
    client.set_registered_model_alias(MODEL, "challenger", models["good"])
    with Traffic(gateway.url, gateway.admin, rows) as traffic:
        started = _run(gateway, thresholds=SHARED_MACHINE)
        assert started["action"] == "started", started
        outcomes = _until(
            gateway,
            lambda o: (o["action"] == "advance" and o["traffic"] == 50) or o["action"] not in ("hold", "advance"),
            thresholds=SHARED_MACHINE,
        )
        assert outcomes[-1]["action"] == "advance" and outcomes[-1]["traffic"] == 50, outcomes[-1]
        # delayed ground truth arrives for what was served so far (the label is the champion's answer),
        # enough of it inside the 50 % step for the accuracy check to judge (20 labelled a side)
        at_50 = datetime.now(UTC)
        traffic.wait_for(lambda s: s.started > at_50 and s.status == 200, 80)
        answered = [s for s in list(traffic.sent) if s.status == 200]
        logged_all(world, [s.request_id for s in answered])  # written off the request path, about every second
        labels = pd.DataFrame(
            [{"request_id": s.request_id, "label": int(s.predictions[0][1] > s.predictions[0][0])} for s in answered]
        )
        labels.to_parquet(tmp_path / "labels.parquet")
        ingested = ingest_labels(endpoint=ENDPOINT, input_path=str(tmp_path / "labels.parquet"))
        assert ingested["matched"] > 0 and ingested["unmatched"] == 0
        final = _until(gateway, lambda o: o["action"] != "hold", thresholds=SHARED_MACHINE)[-1]
        cleaned = _run(gateway, thresholds=SHARED_MACHINE)
        cleaned_at = datetime.now(UTC)
        traffic.wait_for(lambda s: s.started > cleaned_at, 10)  # and it serves on after the clean-up
    assert final["action"] == "promote" and final["event"] == "tollfree.canary.promote" and final["traffic"] == 100, (
        final
    )
    assert next(c for c in final["checks"] if c["metric"] == "accuracy")["status"] == "ok"
    held = versions.aliases(client, MODEL)
    assert held["champion"] == models["good"] and held["previous"] == old and "challenger" not in held
    assert cleaned["action"] == "cleaned"
    view = _view(gateway)
    assert _routes(view) == {f"{MODEL}-{models['good']}": 100}
    history = [h.get("traffic") for h in load_state(world.settings, ENDPOINT).history if "traffic" in h]
    assert history[:4] == [5, 25, 50, 100]
    assert {s.status for s in traffic.sent} == {200}
