"""Rollback flow: ``champion`` back to ``previous`` in one registry update, recording who, when and why.

``python -m flows.rollback --model fraud --reason "p99 doubled after v7"``
"""

from __future__ import annotations

import argparse
import getpass
import os
from datetime import UTC, datetime
from typing import Any

from mlflow import MlflowClient
from prefect import flow, get_run_logger, task

from flows.promote import MLFLOW_RETRIES
from serving.registry import lifecycle
from serving.settings import Settings


@task(**MLFLOW_RETRIES)
def move_back(tracking_uri: str, model_name: str, who: str, reason: str) -> tuple[str, str]:
    return lifecycle.rollback(MlflowClient(tracking_uri), model_name, who=who, why=reason, now=datetime.now(UTC))


@flow(name="rollback")
def rollback(model_name: str = "fraud", reason: str = "manual rollback", who: str | None = None) -> dict[str, Any]:
    """Move ``champion`` back to the ``previous`` version."""
    if not reason.strip():
        raise ValueError("a rollback needs a reason")
    settings = Settings.from_environ(os.environ)
    who = who or getpass.getuser()
    from_version, to_version = move_back(settings.tracking_uri, model_name, who, reason)
    get_run_logger().info(
        "%s champion rolled back from v%s to v%s by %s: %s", model_name, from_version, to_version, who, reason
    )
    return {"from": from_version, "to": to_version, "by": who, "reason": reason}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=rollback.__doc__)
    parser.add_argument("--model", default="fraud")
    parser.add_argument("--reason", required=True)
    args = parser.parse_args(argv)
    rollback(model_name=args.model, reason=args.reason)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
