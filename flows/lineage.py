"""Lineage of a model version: from any served version to its run, params, metrics, training dataset,
FeatureService, code version, data validation and gate results.

``python -m flows.lineage --model fraud --ref champion`` (an alias or a version number).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from mlflow import MlflowClient

from serving.registry import versions
from serving.settings import Settings


def lineage(client: MlflowClient, model_name: str, ref: str) -> dict[str, Any]:
    """Everything recorded about ``model_name`` at ``ref`` (alias or version), by name."""
    mv = versions.resolve(client, model_name, ref)
    run = client.get_run(mv.run_id)
    tags = dict(mv.tags)
    held = versions.aliases(client, model_name)
    return {
        "model": model_name,
        "version": str(mv.version),
        "aliases": sorted(a for a, v in held.items() if v == str(mv.version)),
        "source": mv.source,
        "run": {
            "id": run.info.run_id,
            "experiment_id": run.info.experiment_id,
            "status": run.info.status,
            "start_time": run.info.start_time,
        },
        "params": dict(run.data.params),
        "metrics": dict(run.data.metrics),
        "datasets": [
            {
                "name": d.dataset.name,
                "digest": d.dataset.digest,
                "source": d.dataset.source,
                "context": next((t.value for t in d.tags if t.key == "mlflow.data.context"), None),
            }
            for d in run.inputs.dataset_inputs
        ],
        "feature_service": tags.get("feature_service") or run.data.tags.get("feature_service"),
        "code_version": tags.get("tollfree.git_commit") or run.data.tags.get("tollfree.git_commit"),
        "data_validation": {k: v for k, v in tags.items() if k.startswith("gx.")},
        "gates": {k: v for k, v in tags.items() if k.startswith("gate.")},
        "history": {k: v for k, v in tags.items() if k.startswith(("champion.", "rollback.", "promotion."))},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--ref", default="champion", help="an alias (champion, challenger, ...) or a version number")
    args = parser.parse_args(argv)
    settings = Settings.from_environ(os.environ)
    try:
        found = lineage(MlflowClient(settings.tracking_uri), args.model, args.ref)
    except Exception as exc:  # LookupError for an unknown model, version or alias
        print(f"error: no {args.model} version at {args.ref!r}: {type(exc).__name__}")
        return 2
    print(json.dumps(found, indent=2, sort_keys=False, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
