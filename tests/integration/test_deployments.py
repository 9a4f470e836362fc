"""Deployments registered on a real Prefect API (the session's server) carry their schedules and triggers.

Every test that registers the deployments is in this file: the xdist workers share the session's server, and
registrations of the same deployment names on two work pools at once would race.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

from prefect.client.orchestration import get_client

from flows.deployments import HOURLY, NIGHTLY, deployments, register, training_definitions
from tests.waiting import until

JOB_TEMPLATE = Path(__file__).resolve().parents[2] / "infra" / "prefect" / "kubernetes-base-job-template.json"


def test_every_deployment_lands_on_the_work_pool_with_its_schedule_and_an_importable_entrypoint(prefect_harness):
    names = register("tollfree-test-process", batch_input="/data/in.parquet", batch_output="/data/out")
    assert {
        "materialize/hourly",
        "train/nightly-fraud",
        "promote/after-training-fraud",
        "skew-drift-all/hourly",
        "canary-all/every-5-minutes",
        "batch-score/daily",
    } <= set(names)
    with get_client(sync_client=True) as client:
        materialize = client.read_deployment_by_name("materialize/hourly")
        train = client.read_deployment_by_name("train/nightly-fraud")
        skew = client.read_deployment_by_name("skew-drift-all/hourly")
        batch = client.read_deployment_by_name("batch-score/daily")
        pool = client.read_work_pool("tollfree-test-process")
        deployed = [client.read_deployment_by_name(name) for name in names]
    assert [s.schedule.cron for s in materialize.schedules] == [HOURLY]
    assert [s.schedule.cron for s in train.schedules] == [NIGHTLY]
    # retraining never promotes by itself
    assert train.parameters == {"model_name": "fraud", "feature_service": "fraud_v1", "alias": "candidate"}
    assert skew.parameters == {}  # every endpoint the gateway serves
    assert batch.parameters["input_path"] == "/data/in.parquet"
    assert pool.type == "process"
    assert pool.base_job_template["variables"]["properties"]["working_dir"]["default"]  # runs start in the project
    for name, deployment in zip(names, deployed):
        assert deployment.work_pool_name == "tollfree-test-process"
        module, _, attr = deployment.entrypoint.rpartition(".")  # a module path, not a file relative to some cwd
        assert getattr(importlib.import_module(module), attr).name == name.split("/")[0], deployment.entrypoint


def test_promote_is_triggered_by_a_completed_run_of_the_training_deployment(prefect_harness):
    register("tollfree-test-process")
    with get_client(sync_client=True) as client:
        promote = client.read_deployment_by_name("promote/after-training-fraud")
        automations = client.read_automations_by_name("promote-fraud-after-training")
    assert promote.schedules == []
    assert len(automations) == 1
    trigger = automations[0].trigger
    assert trigger.expect == {"prefect.flow-run.Completed"}
    related = [dict(spec.items()) for spec in trigger.match_related]
    assert {"prefect.resource.role": ["flow"], "prefect.resource.name": ["train"]} in related
    assert {"prefect.resource.role": ["deployment"], "prefect.resource.name": ["nightly-fraud"]} in related
    [action] = automations[0].actions
    assert action.deployment_id == promote.id
    assert action.parameters == {"model_name": "fraud"}


def test_registering_twice_updates_in_place(prefect_harness):
    first = register("tollfree-test-process")
    second = register("tollfree-test-process")
    assert first == second
    with get_client(sync_client=True) as client:
        assert len(client.read_automations_by_name("promote-fraud-after-training")) == 1


def _completed(flow_name: str, deployment_name: str | None = None) -> None:
    """An event shaped like the Prefect server's own for a finished run of ``flow_name`` (from a deployment)."""
    import uuid

    from prefect.events import emit_event

    related = [
        {"prefect.resource.id": f"prefect.flow.{uuid.uuid4()}", "prefect.resource.role": "flow",
         "prefect.resource.name": flow_name},
    ]  # fmt: skip
    if deployment_name is not None:
        related.append(
            {"prefect.resource.id": f"prefect.deployment.{uuid.uuid4()}", "prefect.resource.role": "deployment",
             "prefect.resource.name": deployment_name}
        )  # fmt: skip
    emit_event(
        event="prefect.flow-run.Completed",
        resource={"prefect.resource.id": f"prefect.flow-run.{uuid.uuid4()}", "prefect.resource.name": "a-run"},
        related=related,
    )


def test_a_completed_training_run_event_starts_a_promote_run(prefect_harness):
    """The automation really fires: an event shaped like the server's own for a finished train/nightly-fraud run."""

    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.objects import FlowRun

    register("tollfree-test-process")
    with get_client(sync_client=True) as client:
        promote = client.read_deployment_by_name("promote/after-training-fraud")
    only_promote = DeploymentFilter(id=DeploymentFilterId(any_=[promote.id]))
    with get_client(sync_client=True) as client:
        before = len(client.read_flow_runs(deployment_filter=only_promote))

    _completed("materialize", "hourly")  # not a training run: no promotion
    _completed("train", "adhoc")  # training outside the nightly deployment (the demo's): no promotion either
    _completed("train", "nightly-other")  # another model's training: its own promotion, not this one
    _completed("train", "nightly-fraud")  # last: the server evaluates the events in the order they were sent, so
    # once this one's run exists, the three before it have had their chance to (wrongly) fire

    def promote_runs() -> list[FlowRun]:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(deployment_filter=only_promote)
        return runs if len(runs) > before else []

    runs = until(promote_runs, "the nightly training run's promotion never ran", timeout_s=60, every_s=0.5)
    assert len(runs) == before + 1, "the trigger should fire once, for the nightly training run only"
    assert runs[0].parameters == {"model_name": "fraud"}


def test_every_model_with_a_training_definition_gets_its_training_and_promotion(tmp_path):
    policy = (Path(__file__).resolve().parents[2] / "flows" / "promotion_policies" / "fraud.yaml").read_text()
    (tmp_path / "fraud.yaml").write_text(policy)
    (tmp_path / "churn.yaml").write_text(
        policy.replace("model: fraud", "model: churn").replace("feature_service: fraud_v1", "feature_service: churn_v1")
    )
    (tmp_path / "scorer.yaml").write_text(
        policy.replace("model: fraud", "model: scorer").replace("feature_service: fraud_v1\n", "")
    )  # no FeatureService: not trainable
    assert [(d.model, d.feature_service) for d in training_definitions(tmp_path)] == [
        ("churn", "churn_v1"),
        ("fraud", "fraud_v1"),
    ]
    names = [f"{d.flow_name}/{d.name}" for d in deployments(policies=tmp_path)]
    for model in ("churn", "fraud"):
        assert f"train/nightly-{model}" in names and f"promote/after-training-{model}" in names
    assert not [n for n in names if "scorer" in n]
    assert names.count("skew-drift-all/hourly") == 1 and names.count("canary-all/every-5-minutes") == 1


def test_deployments_register_on_a_kubernetes_work_pool_with_the_infra_job_template(prefect_harness):
    template = json.loads(JOB_TEMPLATE.read_text())
    names = register("tollfree-kubernetes", pool_type="kubernetes", base_job_template=template)
    with get_client(sync_client=True) as client:
        pool = client.read_work_pool("tollfree-kubernetes")
        deployed = [client.read_deployment_by_name(name) for name in names]
    assert pool.type == "kubernetes"
    assert pool.base_job_template["variables"]["properties"]["image"]["default"] == "tollfree:0.1.0"
    assert all(d.work_pool_name == "tollfree-kubernetes" and ":" not in d.entrypoint for d in deployed)


def test_regions_get_an_apply_schedule_and_a_replication_after_each_promotion(prefect_harness):
    names = register(
        "tollfree-test-process", endpoint_files=["/etc/tollfree/endpoints.yaml"], replicate_to=["http://b:5000"]
    )
    assert {"apply/every-5-minutes", "replicate/after-promotion-fraud"} <= set(names)
    with get_client(sync_client=True) as client:
        apply = client.read_deployment_by_name("apply/every-5-minutes")
        replicate = client.read_deployment_by_name("replicate/after-promotion-fraud")
        automations = client.read_automations_by_name("replicate-fraud-after-promotion")
    assert [s.schedule.cron for s in apply.schedules] == ["*/5 * * * *"]
    assert apply.parameters == {"files": ["/etc/tollfree/endpoints.yaml"]}
    assert replicate.parameters == {"model_name": "fraud", "alias": "champion", "to": ["http://b:5000"]}
    (automation,) = automations
    assert automation.trigger.expect == {"prefect.flow-run.Completed"}
    related = automation.trigger.match_related
    (spec,) = related if isinstance(related, list) else [related]
    assert dict(spec.items())["prefect.resource.name"] == ["promote", "canary-all", "rollback"]
    assert automation.actions[0].deployment_id == replicate.id
    plain = {f"{d.flow_name}/{d.name}" for d in deployments()}
    assert not {n for n in plain if n.startswith(("apply/", "replicate/"))}  # one region: neither


def test_a_completed_canary_run_event_starts_a_replication_to_the_other_regions(prefect_harness):
    """The replication's automation really fires on a finished canary run, with the other regions as parameters, and
    not on a flow run of another flow."""

    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    register("tollfree-test-process", replicate_to=["http://b:5000"])
    with get_client(sync_client=True) as client:
        replicate = client.read_deployment_by_name("replicate/after-promotion-fraud")
    only_replicate = DeploymentFilter(id=DeploymentFilterId(any_=[replicate.id]))
    with get_client(sync_client=True) as client:
        before = len(client.read_flow_runs(deployment_filter=only_replicate))

    _completed("materialize")  # not a promotion: no replication
    _completed("canary-all")  # last: once its run exists, the one before had its chance to (wrongly) fire

    def replicate_runs() -> list:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(deployment_filter=only_replicate)
        return runs if len(runs) > before else []

    runs = until(replicate_runs, "the canary run's replication never ran", timeout_s=60, every_s=0.5)
    assert len(runs) == before + 1, "the trigger should fire once, for the canary run only"
    assert runs[0].parameters == {"model_name": "fraud", "alias": "champion", "to": ["http://b:5000"]}
