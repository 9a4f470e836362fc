"""Label ingestion: ``python -m flows.labels --input labels.parquet [--endpoint NAME]``.

Delayed ground truth (a parquet or CSV file with ``request_id``, ``label`` and optionally ``row``) is
joined to the inference log by request id (``monitoring.labels``), whichever endpoint logged the request
(or only the named endpoint's), and written as labelled rows, one parquet file per endpoint and run,
atomically, under ``$TOLLFREE_HOME/labels/endpoint=<name>/``. The
canary verdict reads them for accuracy. A label arriving again for the same row replaces the old one.
"""

from __future__ import annotations

import argparse
import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event

from flows.fan_out import artifact_key
from monitoring.labels import LABELLED_COLUMNS, join_labels
from serving.inference_log import endpoint_dirname, read_inference_log
from serving.settings import Settings


def labels_dir(settings: Settings, endpoint: str) -> Path:
    return settings.home / "labels" / endpoint_dirname(endpoint)


def read_label_file(path: Path) -> pd.DataFrame:
    if not path.exists():
        raise FileNotFoundError(f"labels file {path} does not exist")
    return pd.read_csv(path) if path.suffix.lower() == ".csv" else pd.read_parquet(path)


def write_labelled(settings: Settings, endpoint: str, labelled: pd.DataFrame, now: datetime) -> Path | None:
    if labelled.empty:
        return None
    folder = labels_dir(settings, endpoint)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"part-{now:%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = folder / f".{name}.tmp"
    frame = labelled.assign(labelled_at=pd.Timestamp(now))
    frame["label"] = frame["label"].astype(str)
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, folder / name)
    return folder / name


def read_labelled(settings: Settings, endpoint: str, since: datetime | None = None) -> pd.DataFrame:
    """Labelled rows of ``endpoint`` for requests at or after ``since``; the latest label of a row wins."""
    parts = sorted(labels_dir(settings, endpoint).glob("part-*.parquet"))
    if not parts:
        return pd.DataFrame(columns=[*LABELLED_COLUMNS, "labelled_at"])
    frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    frame = frame.sort_values("labelled_at").drop_duplicates(["request_id", "row"], keep="last")
    if since is not None:
        frame = frame[pd.to_datetime(frame["timestamp"], utc=True) >= pd.Timestamp(since)]
    return frame.reset_index(drop=True)


@flow(name="labels")
def ingest_labels(input_path: str, endpoint: str | None = None, lookback_days: float = 30.0) -> dict[str, Any]:
    """Join delayed labels to the logged predictions by request id and store them under the endpoint that
    logged each request (every endpoint's log is searched unless ``endpoint`` names one)."""
    logger = get_run_logger()
    settings = Settings.from_environ(os.environ)
    now = datetime.now(UTC)
    labels = read_label_file(Path(input_path))
    log = read_inference_log(settings.inference_log_dir, endpoint=endpoint, since=now - timedelta(days=lookback_days))
    joined = join_labels(log, labels)
    written = {
        name: write_labelled(settings, str(name), rows, now)
        for name, rows in joined.labelled.groupby("endpoint", sort=True)
    }
    table = joined.accuracy_by_entity()
    scope = endpoint or "every endpoint"
    create_table_artifact(
        key=artifact_key(f"labels-{endpoint or 'all'}"),
        table=table or [{"served_entity": None, "rows": 0}],
        description=f"Labels joined for {scope}: {len(joined.labelled)} rows matched, {joined.unmatched} unmatched",
    )
    counts = {str(name): len(rows) for name, rows in joined.labelled.groupby("endpoint", sort=True)}
    for name, count in counts.items():
        emit_event(
            event="tollfree.labels.ingested",
            resource={"prefect.resource.id": f"tollfree.endpoint.{name}"},
            payload={"matched": count, "unmatched": joined.unmatched},
        )
    logger.info(
        "%s: %d labels matched to logged requests %s, %d unmatched; written to %s",
        scope,
        len(joined.labelled),
        counts,
        joined.unmatched,
        {k: str(v) for k, v in written.items()} or "nothing",
    )
    return {
        "endpoint": endpoint,
        "matched": len(joined.labelled),
        "by_endpoint": counts,
        "unmatched": joined.unmatched,
        "output": {str(k): str(v) for k, v in written.items() if v},
        "accuracy": table,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=ingest_labels.__doc__)
    parser.add_argument("--endpoint", help="only this endpoint's requests; default: whichever endpoint logged them")
    parser.add_argument("--input", required=True, help="parquet or CSV with request_id, label[, row]")
    parser.add_argument("--lookback-days", type=float, default=30.0)
    args = parser.parse_args(argv)
    ingest_labels(input_path=args.input, endpoint=args.endpoint, lookback_days=args.lookback_days)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
