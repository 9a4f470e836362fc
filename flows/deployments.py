"""Every deployment of tollfree, in one place (the single source of truth for schedules and triggers).

The same list runs two ways:

- ``python -m flows.deployments --work-pool NAME [--pool-type process|kubernetes] [--base-job-template FILE]``
  creates or updates the work pool and registers every deployment on it; a worker of that pool runs
  them. ``make up`` registers them on a process pool; a cluster on a Kubernetes pool (``infra/prefect/``).
- ``python -m flows.deployments`` serves them all from this one process (Prefect's ``serve``), no worker.

Entrypoints are module paths (``flows.train.train``): the worker imports them from the installed
project (a checkout's editable install, or the container image), whatever its working directory.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Flow, serve
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

from flows.apply import apply_endpoints
from flows.batch_score import batch_score
from flows.canary import canary_all
from flows.edge_bundle import ENABLED_ENV as EDGE_ENV
from flows.edge_bundle import edge_bundle
from flows.labels import ingest_labels
from flows.materialize import materialize
from flows.promote import PROMOTION_POLICY_DIR, promote
from flows.replicate import TARGETS_ENV, replicate, targets_from
from flows.rollback import rollback
from flows.skew import skew_all
from flows.train import train
from serving.registry.promotion_policy import load_policy

PROJECT_DIR = Path(__file__).resolve().parent.parent
ENDPOINTS_FILE_ENV = "TOLLFREE_ENDPOINTS_FILE"
HOURLY = "0 * * * *"
NIGHTLY = "0 2 * * *"
DAILY_MORNING = "0 5 * * *"
EVERY_5_MINUTES = "*/5 * * * *"


def _deployment(flow: Flow[Any, Any], name: str, **kwargs: Any) -> RunnerDeployment:
    return flow.to_deployment(name=name, entrypoint_type=EntrypointType.MODULE_PATH, **kwargs)


def training_deployment(model_name: str) -> str:
    return f"nightly-{model_name}"


@dataclass(frozen=True)
class TrainingDefinition:
    """A model the train flow can retrain: its promotion policy names the model and its FeatureService."""

    model: str
    feature_service: str


def training_definitions(folder: Path = PROMOTION_POLICY_DIR) -> list[TrainingDefinition]:
    """Every policy in ``folder`` that names a FeatureService (the train flow trains through one), checked."""
    policies = [load_policy(path) for path in sorted(folder.glob("*.yaml"))]
    return [TrainingDefinition(p.model, p.feature_service) for p in policies if p.feature_service]


def promote_after_training(model_name: str) -> DeploymentEventTrigger:
    """Fires on every completed run of ``train/nightly-MODEL``: promote then judges the candidate it registered."""
    return DeploymentEventTrigger(
        name=f"promote-{model_name}-after-training",
        description="A finished training run hands its candidate to the promotion gates.",
        expect={"prefect.flow-run.Completed"},
        match_related=[
            {"prefect.resource.role": "flow", "prefect.resource.name": train.name},
            {"prefect.resource.role": "deployment", "prefect.resource.name": training_deployment(model_name)},
        ],
        parameters={"model_name": model_name},
    )


def after_promotion(flow_name: str, model_name: str, description: str) -> DeploymentEventTrigger:
    """Fires on every completed promote, canary or rollback run: the champion may have moved (a promotion's first
    version, a canary's end, a rollback), and what follows the champion (the other regions' registries, the edge
    bundle) follows it; a version done already is not done again."""
    return DeploymentEventTrigger(
        name=f"{flow_name}-{model_name}-after-promotion",
        description=description,
        expect={"prefect.flow-run.Completed"},
        match_related={
            "prefect.resource.role": "flow",
            "prefect.resource.name": [promote.name, canary_all.name, rollback.name],
        },
        parameters={"model_name": model_name, "alias": "champion"},
    )


def replicate_after_promotion(model_name: str) -> DeploymentEventTrigger:
    return after_promotion(
        "replicate", model_name,
        "A finished promote, canary or rollback run hands the champion to the other regions' registries.",
    )  # fmt: skip


def edge_bundle_after_promotion(model_name: str) -> DeploymentEventTrigger:
    return after_promotion(
        "edge-bundle", model_name, "A finished promote, canary or rollback run bundles the champion for devices."
    )


def _per_model(
    definition: TrainingDefinition, replicate_to: Sequence[str], edge_bundles: bool
) -> list[RunnerDeployment]:
    model = definition.model
    return (
        [
            _deployment(
                train,
                training_deployment(model),
                cron=NIGHTLY,
                parameters={"model_name": model, "feature_service": definition.feature_service, "alias": "candidate"},
                description=f"Retrain {model} on point-in-time features; registers a candidate, never promotes.",
            ),
            _deployment(
                promote,
                f"after-training-{model}",
                parameters={"model_name": model},
                triggers=[promote_after_training(model)],
                description=f"Promotion gates on {model}'s candidate after each finished training run (event trigger).",
            ),
        ]
        + (
            [
                _deployment(
                    replicate,
                    f"after-promotion-{model}",
                    parameters={"model_name": model, "alias": "champion", "to": list(replicate_to)},
                    triggers=[replicate_after_promotion(model)],
                    description=f"Copy {model}'s champion into the other regions' registries after each promote, "
                    "canary or rollback run (event trigger).",
                )
            ]
            if replicate_to
            else []
        )
        + (
            [
                _deployment(
                    edge_bundle,
                    f"after-promotion-{model}",
                    parameters={"model_name": model, "alias": "champion"},
                    triggers=[edge_bundle_after_promotion(model)],
                    description=f"Bundle {model}'s champion for edge devices (ONNX, verified, signed) after each "
                    "promote, canary or rollback run (event trigger).",
                )
            ]
            if edge_bundles
            else []
        )
    )


def deployments(
    batch_input: str | None = None,
    batch_output: str | None = None,
    labels_input: str | None = None,
    policies: Path = PROMOTION_POLICY_DIR,
    endpoint_files: Sequence[str] = (),
    replicate_to: Sequence[str] = (),
    edge_bundles: bool = False,
) -> list[RunnerDeployment]:
    """The deployments with their schedules: monitoring covers every endpoint the gateway serves, retraining
    and promotion every model with a training definition; retraining registers a ``candidate``, never promotes.
    With ``endpoint_files``, the gateway's endpoints are made to match them every 5 minutes; with
    ``replicate_to`` (other regions' registries), each model's champion is copied there after a promotion; with
    ``edge_bundles``, it is bundled for edge devices after a promotion."""
    out = [
        _deployment(
            materialize, "hourly", cron=HOURLY, description="Recompute feature tables and load the online store."
        )
    ]
    for definition in training_definitions(policies):
        out += _per_model(definition, replicate_to, edge_bundles)
    out += [
        _deployment(
            skew_all,
            "hourly",
            cron=HOURLY,
            description="Drift of every endpoint's served inputs and predictions against each version's "
            "reference; parity skew. One subflow per endpoint.",
        ),
        _deployment(
            canary_all,
            "every-5-minutes",
            cron=EVERY_5_MINUTES,
            description="Canary verdict on every endpoint: start, adopt, advance, hold, roll back or promote "
            "its challenger. One subflow per endpoint.",
        ),
    ]
    if endpoint_files:
        out.append(
            _deployment(
                apply_endpoints,
                "every-5-minutes",
                cron=EVERY_5_MINUTES,
                parameters={"files": list(endpoint_files)},
                description="Make the gateway's endpoints match the endpoints files; an alias that moved rolls "
                "its endpoints to the new version.",
            )
        )
    if labels_input:
        out.append(
            _deployment(
                ingest_labels,
                "daily",
                cron=DAILY_MORNING,
                parameters={"input_path": labels_input},
                description="Join the day's delayed labels to logged requests by request id, "
                "whichever endpoint logged them.",
            )
        )
    if batch_input and batch_output:
        out.append(
            _deployment(
                batch_score,
                "daily",
                cron=DAILY_MORNING,
                parameters={"input_path": batch_input, "output": batch_output},
                description="Score the day's batch with the champion.",
            )
        )
    return out


def process_pool_template(working_dir: Path = PROJECT_DIR) -> dict[str, Any]:
    """Prefect's process-worker job template, flow runs started in the project folder."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    template["variables"]["properties"]["working_dir"]["default"] = str(working_dir)
    return template


def ensure_work_pool(name: str, pool_type: str, base_job_template: dict[str, Any]) -> None:
    """Create the pool, or bring an existing one's job template up to date (its pause state is kept)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(name)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, base_job_template=base_job_template))
                return
            except ObjectAlreadyExists:  # a worker starting at the same time created it first
                existing = client.read_work_pool(name)
        if existing.type != pool_type:
            raise ValueError(f"work pool {name!r} exists with type {existing.type!r}, not {pool_type!r}")
        client.update_work_pool(name, WorkPoolUpdate(base_job_template=base_job_template))


def register(
    work_pool: str, *, pool_type: str = "process", base_job_template: dict[str, Any] | None = None, **kwargs: Any
) -> list[str]:
    """Create or update ``work_pool``, apply every deployment to it; returns ``flow/deployment`` names."""
    if base_job_template is None:
        if pool_type != "process":
            raise ValueError(f"a {pool_type} work pool needs its base job template (see infra/prefect/)")
        base_job_template = process_pool_template()
    ensure_work_pool(work_pool, pool_type, base_job_template)
    names = []
    for deployment in deployments(**kwargs):
        deployment.apply(work_pool_name=work_pool)
        names.append(f"{deployment.flow_name}/{deployment.name}")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.deployments", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--work-pool", help="register on this work pool instead of serving from this process")
    parser.add_argument(
        "--pool-type", default="process", help="work pool type when it is created (process, kubernetes)"
    )
    parser.add_argument(
        "--base-job-template", type=Path, help="JSON job template of the pool (required unless process)"
    )
    parser.add_argument(
        "--policies",
        type=Path,
        default=PROMOTION_POLICY_DIR,
        help="folder of promotion policies: each naming a FeatureService is a model to retrain",
    )
    parser.add_argument("--batch-input", help="parquet the daily batch-score deployment reads")
    parser.add_argument("--batch-output", help="folder the daily batch-score deployment writes")
    parser.add_argument("--labels-input", help="parquet or CSV of delayed labels the daily label ingestion reads")
    parser.add_argument(
        "--endpoints-file",
        action="append",
        default=[f for f in [os.environ.get(ENDPOINTS_FILE_ENV)] if f],
        help=f"an endpoints file applied every 5 minutes (repeatable; default: {ENDPOINTS_FILE_ENV})",
    )
    parser.add_argument(
        "--replicate-to",
        default=os.environ.get(TARGETS_ENV, ""),
        help=f"other regions' registry URIs, comma-separated (default: {TARGETS_ENV})",
    )
    parser.add_argument(
        "--edge-bundles",
        action="store_true",
        default=os.environ.get(EDGE_ENV) == "1",
        help=f"bundle each model's champion for edge devices after a promotion (default: {EDGE_ENV}=1)",
    )
    args = parser.parse_args(argv)
    kwargs = {
        "batch_input": args.batch_input,
        "batch_output": args.batch_output,
        "labels_input": args.labels_input,
        "policies": args.policies,
        "endpoint_files": [str(Path(f).resolve()) for f in args.endpoints_file],
        "replicate_to": targets_from(args.replicate_to),
        "edge_bundles": args.edge_bundles,
    }
    if args.work_pool is None:
        serve(*deployments(**kwargs))
        return 0
    template = json.loads(args.base_job_template.read_text()) if args.base_job_template else None
    for name in register(args.work_pool, pool_type=args.pool_type, base_job_template=template, **kwargs):
        print(f"registered {name} on work pool {args.work_pool}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
