"""Label ingestion under Prefect's harness: delayed labels joined to logged requests by request id,
stored for the canary, with a table artifact and an event an automation can react to."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta

import pandas as pd

from serving.inference_log import InferenceLogWriter, InferenceRecord
from serving.settings import Settings

ENDPOINT = "labelled"


def _log_requests(settings: Settings, endpoint: str = ENDPOINT, prefix: str = "req") -> None:
    now = datetime.now(UTC)
    with InferenceLogWriter(settings.inference_log_dir) as log:
        for i in range(6):
            log.record(
                InferenceRecord(
                    request_id=f"{prefix}-{i}",
                    timestamp=now - timedelta(minutes=10 - i),
                    endpoint=endpoint,
                    served_entity="m-1" if i % 2 else "m-2",
                    model_version="1" if i % 2 else "2",
                    status_code=200 if i != 5 else 500,
                    latency_ms=3.0,
                    inputs=None,
                    served_features=None,
                    outputs=json.dumps([[0.8, 0.2]]) if i != 5 else None,
                    error_code=None,
                    rows=1,
                )
            )


def _events(name: str, resource_id: str, timeout_s: float = 30.0) -> list:
    """This test's events only: other tests in the session emit the same event for their endpoints."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_events(
                filter=EventFilter(event=EventNameFilter(name=[name]), resource=EventResourceFilter(id=[resource_id])),
                limit=50,
            )
            mine = [e for e in page.events if e.resource.id == resource_id]
            if mine or time.monotonic() > deadline:
                return mine
            time.sleep(0.5)


def test_labels_are_joined_stored_reported_and_announced(prefect_harness, tmp_path):
    from flows.labels import ingest_labels, read_labelled

    settings = Settings.from_environ(os.environ)
    _log_requests(settings)
    labels = pd.DataFrame({"request_id": ["req-0", "req-1", "req-2", "req-5", "unknown"], "label": [0, 0, 1, 1, 0]})
    labels.to_csv(tmp_path / "labels.csv", index=False)

    result = ingest_labels(endpoint=ENDPOINT, input_path=str(tmp_path / "labels.csv"))
    assert result["matched"] == 3 and result["unmatched"] == 2  # a failed request and an unknown id
    stored = read_labelled(settings, ENDPOINT).set_index("request_id")
    assert stored.loc["req-0", "correct"] and stored.loc["req-1", "correct"] and not stored.loc["req-2", "correct"]

    # a corrected label replaces the old one
    pd.DataFrame({"request_id": ["req-2"], "label": [0]}).to_parquet(tmp_path / "fix.parquet")
    ingest_labels(endpoint=ENDPOINT, input_path=str(tmp_path / "fix.parquet"))
    assert read_labelled(settings, ENDPOINT).set_index("request_id").loc["req-2", "correct"]
    assert len(read_labelled(settings, ENDPOINT, since=datetime.now(UTC) - timedelta(minutes=9, seconds=30))) == 2

    events = _events("tollfree.labels.ingested", f"tollfree.endpoint.{ENDPOINT}")
    assert events and events[0].resource.id == f"tollfree.endpoint.{ENDPOINT}"
    assert {"matched", "unmatched"} <= set(events[0].payload)

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"labels-{ENDPOINT}"]))
        )
    assert artifacts and artifacts[0].type == "table"


def test_labels_without_an_endpoint_go_to_whichever_endpoint_logged_each_request(prefect_harness, tmp_path):
    from flows.labels import ingest_labels, read_labelled

    settings = Settings.from_environ(os.environ)
    _log_requests(settings, "labels-a", "a")
    _log_requests(settings, "labels-b", "b")
    labels = pd.DataFrame({"request_id": ["a-0", "a-1", "b-3", "nobody"], "label": [0, 1, 0, 1]})
    labels.to_parquet(tmp_path / "mixed.parquet")

    result = ingest_labels(input_path=str(tmp_path / "mixed.parquet"))
    assert result["by_endpoint"] == {"labels-a": 2, "labels-b": 1} and result["unmatched"] == 1
    assert sorted(read_labelled(settings, "labels-a")["request_id"]) == ["a-0", "a-1"]
    assert list(read_labelled(settings, "labels-b")["request_id"]) == ["b-3"]
