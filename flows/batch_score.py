"""Batch scoring flow: ``python -m flows.batch_score --input PATH --output PATH [--model-uri URI] [--run-id ID]``."""

from __future__ import annotations

import argparse
import os
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from serving import batch
from serving.settings import Settings


@task
def score(input_path: Path, output: Path, model_uri: str, run_id: str) -> batch.BatchResult:
    settings = Settings.from_environ(os.environ)
    return batch.score_dataset(input_path, output, model_uri, settings.home, settings.tracking_uri, run_id)


@flow(name="batch-score")
def batch_score(input_path: str, output: str, model_uri: str = "models:/fraud@champion", run_id: str | None = None) -> dict[str, Any]:
    """Score a parquet dataset of entity keys, timestamps and request fields with a registered model."""
    logger = get_run_logger()
    run_id = run_id or uuid.uuid4().hex[:12]
    result = score(Path(input_path), Path(output), model_uri, run_id)
    logger.info("scored %d rows with %s (version %s) in %.1fs -> %s", result.rows, model_uri, result.model_version,
                result.seconds, result.output)
    return {"rows": result.rows, "output": str(result.output), "model_version": result.model_version, "run_id": run_id,
            "seconds": result.seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=batch_score.__doc__)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--model-uri", default="models:/fraud@champion")
    parser.add_argument("--engine", choices=["local"], default="local")
    parser.add_argument("--run-id", default=None)
    args = parser.parse_args(argv)
    batch_score(input_path=args.input, output=args.output, model_uri=args.model_uri, run_id=args.run_id)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
