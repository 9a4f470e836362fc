"""An endpoint whose config turns monitoring off is skipped by the drift flow, which says so and reads nothing,
and one with its own thresholds is checked with them (Prefect's harness, the real endpoint store)."""

from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from serving.endpoints import spec, validation
from serving.endpoints.store import EndpointStore
from serving.inference_log import InferenceLogWriter, InferenceRecord
from serving.settings import Settings


@pytest.fixture
def stored(prefect_harness):  # type: ignore[no-untyped-def]
    """Two endpoint records in the session's store (no gateway serves them), removed afterwards."""
    store = EndpointStore(Settings.from_environ(os.environ).state_url)
    names = {"quiet-ep": {"enabled": False}, "strict-ep": {"min_rows": 10_000}}
    for name, monitoring in names.items():
        config = validation.normalize_config(
            spec.EndpointCoreConfig.model_validate(
                {"served_entities": [{"entity_name": "fraud", "entity_version": "1"}], "monitoring": monitoring}
            )
        )
        store.create(
            spec.EndpointRecord(
                name=name,
                id=uuid.uuid4().hex,
                creator="test",
                created_ms=0,
                updated_ms=0,
                config=config,
                ready="READY",
                config_update="NOT_UPDATING",
            )
        )
    yield list(names)
    for name in names:
        store.delete(name)


def _served(endpoint: str, requests: int) -> None:
    now = datetime.now(UTC)
    with InferenceLogWriter(Settings.from_environ(os.environ).inference_log_dir) as log:
        for i in range(requests):
            log.record(
                InferenceRecord(
                    request_id=f"{endpoint}-{i}",
                    timestamp=now - timedelta(seconds=i),
                    endpoint=endpoint,
                    served_entity="fraud-1",
                    model_version="1",
                    status_code=200,
                    latency_ms=2.0,
                    served_features=None,
                    inputs=json.dumps({"dataframe_records": [{"amount": float(i)}]}),
                    outputs="[0.5]",
                    error_code=None,
                    rows=1,
                )
            )


def test_an_endpoint_that_opts_out_is_skipped_and_one_with_its_own_minimum_uses_it(stored):
    from flows.skew import skew

    _served("quiet-ep", 60)
    _served("strict-ep", 60)  # over the flow's default minimum of 50 rows
    quiet = skew(endpoint="quiet-ep")
    assert quiet["verdict"] == "disabled" and quiet["rows"] == 0
    strict = skew(endpoint="strict-ep")
    assert strict["verdict"] == "not enough data" and strict["rows"] == 60  # under the endpoint's own 10,000
