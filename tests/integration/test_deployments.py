"""Deployments registered on a real Prefect API (the test harness) carry their schedules and triggers."""

from __future__ import annotations

import importlib

from prefect.client.orchestration import get_client

from flows.deployments import HOURLY, NIGHTLY, register


def test_every_deployment_lands_on_the_work_pool_with_its_schedule_and_an_importable_entrypoint(prefect_harness):
    names = register("tollfree-test-process", batch_input="/data/in.parquet", batch_output="/data/out")
    assert {"materialize/hourly", "train/nightly", "promote/after-training", "skew-drift/hourly",
            "batch-score/daily"} <= set(names)
    with get_client(sync_client=True) as client:
        materialize = client.read_deployment_by_name("materialize/hourly")
        train = client.read_deployment_by_name("train/nightly")
        batch = client.read_deployment_by_name("batch-score/daily")
        pool = client.read_work_pool("tollfree-test-process")
        deployed = [client.read_deployment_by_name(name) for name in names]
    assert [s.schedule.cron for s in materialize.schedules] == [HOURLY]
    assert [s.schedule.cron for s in train.schedules] == [NIGHTLY]
    assert train.parameters == {"model_name": "fraud", "alias": "candidate"}  # retraining never promotes by itself
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
        promote = client.read_deployment_by_name("promote/after-training")
        automations = client.read_automations_by_name("promote-fraud-after-training")
    assert promote.schedules == []
    assert len(automations) == 1
    trigger = automations[0].trigger
    assert trigger.expect == {"prefect.flow-run.Completed"}
    related = [dict(spec.items()) for spec in trigger.match_related]
    assert {"prefect.resource.role": ["flow"], "prefect.resource.name": ["train"]} in related
    assert {"prefect.resource.role": ["deployment"], "prefect.resource.name": ["nightly"]} in related
    [action] = automations[0].actions
    assert action.deployment_id == promote.id
    assert action.parameters == {"model_name": "fraud"}


def test_registering_twice_updates_in_place(prefect_harness):
    first = register("tollfree-test-process")
    second = register("tollfree-test-process")
    assert first == second
    with get_client(sync_client=True) as client:
        assert len(client.read_automations_by_name("promote-fraud-after-training")) == 1
