"""Every scheduled deployment of tollfree, in one place (the single source of truth for schedules).

``python -m flows.deployments`` serves them all from this process (Prefect's ``serve``): the flows run
on their schedules and can be triggered from the Prefect UI or ``prefect deployment run``.
"""

from __future__ import annotations

from prefect import serve
from prefect.deployments.runner import RunnerDeployment

from flows.batch_score import batch_score
from flows.materialize import materialize
from flows.skew import skew
from flows.train import train

HOURLY = "0 * * * *"
NIGHTLY = "0 2 * * *"
DAILY_MORNING = "0 5 * * *"


def deployments(endpoint: str = "fraud", batch_input: str | None = None, batch_output: str | None = None) -> list[RunnerDeployment]:
    """The deployments with their schedules; retraining registers a ``candidate`` and never promotes."""
    out = [
        materialize.to_deployment(name="hourly", cron=HOURLY, description="Recompute feature tables and load the online store."),
        train.to_deployment(name="nightly", cron=NIGHTLY, parameters={"alias": "candidate"},
                            description="Retrain on point-in-time features; registers a candidate, never promotes."),
        skew.to_deployment(name="hourly", cron=HOURLY, parameters={"endpoint": endpoint},
                           description="Drift of served features against the training data."),
    ]
    if batch_input and batch_output:
        out.append(batch_score.to_deployment(name="daily", cron=DAILY_MORNING,
                                             parameters={"input_path": batch_input, "output": batch_output}))
    return out


def main() -> int:
    serve(*deployments())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
