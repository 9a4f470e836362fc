"""Batch scoring flow (thin: the work is ``serving.batch``).

    python -m flows.batch_score --input PATH --output PATH [--model-uri URI] [--engine local|dask]
                                [--run-id ID] [--chunk-rows N] [--dask-address ADDR] [--dask-workers N]

Input: parquet (a file or a directory) with the row key, the entity keys, the request-time fields and
``event_timestamp``; for a model registered without a FeatureService, the row key, ``event_timestamp``
and the model's signature columns (features given; no feature store is opened).
Output: ``OUTPUT/run=ID/version=V/date=D/part-*.parquet`` plus a ``_SUCCESS`` manifest, published in one rename;
the same run id replaces its own output and nothing else.
Progress: a Prefect progress artifact (``batch-score-<run id>``) and log lines (rows done, rows/s).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.runtime import flow_run

from serving import batch
from serving.registry.errors import RegistryUnavailable
from serving.settings import Settings

DEFAULT_MODEL_URI = "models:/fraud@champion"
PROGRESS_EVERY_SECONDS = 2.0


class ProgressReporter:
    """Rows done and rows/s to the run log and a Prefect progress artifact, at most every few seconds."""

    def __init__(self, run_id: str) -> None:
        self.logger = get_run_logger()
        key = "batch-score-" + re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
        self.artifact = create_progress_artifact(0.0, key=key[:100], description=f"batch scoring run {run_id}")
        self.last = 0.0

    def __call__(self, progress: batch.Progress) -> None:
        now = time.monotonic()
        final = progress.chunks_done == progress.chunks_total
        if not final and now - self.last < PROGRESS_EVERY_SECONDS:
            return
        self.last = now
        percent = 100.0 * progress.rows_done / max(progress.rows_total, 1)
        update_progress_artifact(self.artifact, percent)
        self.logger.info(
            "%d / %d rows scored (%.0f%%), %d / %d chunks, %.0f rows/s",
            progress.rows_done,
            progress.rows_total,
            percent,
            progress.chunks_done,
            progress.chunks_total,
            progress.rows_per_second,
        )


@task
def score(
    input_path: Path,
    output: Path,
    model_uri: str,
    run_id: str,
    engine: str,
    chunk_rows: int,
    dask_address: str | None,
    dask_workers: int,
) -> batch.BatchResult:
    settings = Settings.from_environ(os.environ)
    return batch.score_dataset(
        input_path,
        output,
        model_uri,
        settings.home,
        settings.tracking_uri,
        run_id,
        chunk_rows=chunk_rows,
        engine=engine,
        dask=batch.DaskOptions(dask_address, dask_workers),
        on_progress=ProgressReporter(run_id),
    )


@flow(name="batch-score")
def batch_score(
    input_path: str,
    output: str,
    model_uri: str = DEFAULT_MODEL_URI,
    run_id: str | None = None,
    engine: str = "local",
    chunk_rows: int = batch.job.DEFAULT_CHUNK_ROWS,
    dask_address: str | None = None,
    dask_workers: int = 2,
) -> dict[str, Any]:
    """Score a parquet dataset of entity keys, timestamps and request fields (or, for a model without a
    FeatureService, of the model's own input columns) with a registered model."""
    logger = get_run_logger()
    # default: this flow run's id, so a Prefect retry of the run replaces its own partial attempt
    run_id = run_id or str(flow_run.id or uuid.uuid4().hex[:12])
    result = score(Path(input_path), Path(output), model_uri, run_id, engine, chunk_rows, dask_address, dask_workers)
    logger.info(
        "scored %d rows with %s (version %s, engine %s) in %.1fs -> %s",
        result.rows,
        model_uri,
        result.model_version,
        engine,
        result.seconds,
        result.output,
    )
    return {
        "rows": result.rows,
        "output": str(result.output),
        "model_version": result.model_version,
        "run_id": run_id,
        "seconds": result.seconds,
        "engine": engine,
        "files": result.files,
        "rows_without_features": result.rows_without_features,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="parquet file or directory")
    parser.add_argument("--output", required=True, help="output root directory")
    parser.add_argument("--model-uri", default=DEFAULT_MODEL_URI, help="models:/NAME@ALIAS or models:/NAME/VERSION")
    parser.add_argument("--engine", choices=list(batch.engines.ENGINES), default="local")
    parser.add_argument(
        "--run-id", default=None, help="re-using a run id replaces that run's output (default: the flow run id)"
    )
    parser.add_argument(
        "--chunk-rows", type=int, default=batch.job.DEFAULT_CHUNK_ROWS, help="rows per chunk (bounds memory)"
    )
    parser.add_argument("--dask-address", default=None, help="Dask scheduler address; default: a local cluster")
    parser.add_argument("--dask-workers", type=int, default=2, help="local cluster worker processes")
    args = parser.parse_args(argv)
    try:
        result = batch_score(
            input_path=args.input,
            output=args.output,
            model_uri=args.model_uri,
            run_id=args.run_id,
            engine=args.engine,
            chunk_rows=args.chunk_rows,
            dask_address=args.dask_address,
            dask_workers=args.dask_workers,
        )
    except (ValueError, LookupError, FileNotFoundError) as exc:
        print(f"batch scoring refused: {exc}", file=sys.stderr)
        return 2
    except RegistryUnavailable as exc:
        print(f"batch scoring failed: {exc}", file=sys.stderr)
        return 1
    print(f"{result['rows']} rows scored -> {result['output']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
