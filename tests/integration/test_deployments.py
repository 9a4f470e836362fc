"""Deployments registered on a real Prefect API (the test harness) carry their schedules."""

from __future__ import annotations

from prefect.client.orchestration import get_client

from flows.deployments import HOURLY, NIGHTLY, deployments


def test_materialize_runs_hourly_and_training_nightly_without_promoting(prefect_harness):
    for deployment in deployments(batch_input="/data/in.parquet", batch_output="/data/out"):
        deployment.apply()
    with get_client(sync_client=True) as client:
        materialize = client.read_deployment_by_name("materialize/hourly")
        train = client.read_deployment_by_name("train/nightly")
        batch = client.read_deployment_by_name("batch-score/daily")
    assert [s.schedule.cron for s in materialize.schedules] == [HOURLY]
    assert [s.schedule.cron for s in train.schedules] == [NIGHTLY]
    assert train.parameters == {"alias": "candidate"}
    assert batch.parameters["input_path"] == "/data/in.parquet"
