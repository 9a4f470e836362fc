"""Batch scoring on the real registry, feature store and Prefect: bad input, kills, the Dask engine.

Row counts, pyfunc parity and idempotent reruns are in ``test_batch_and_drift``; this module adds what
the batch issue's "done when" asks beyond them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow.dataset as ds
import pytest

from serving import batch
from serving.batch import output_layout
from tests.world import MODEL_NAME, two_days_of_transactions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inline_validation")]
PROJECT = Path(__file__).resolve().parents[2]
COLUMNS = ["transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount"]


@pytest.fixture(scope="module")
def two_days(world, tmp_path_factory) -> Path:
    """Two days of transactions (two date partitions), from a few days before the data's end."""
    return two_days_of_transactions(world, tmp_path_factory.mktemp("batch-input") / "two_days.parquet", COLUMNS)


def _score(world, input_path: Path, out: Path, run_id: str, **kwargs):
    return batch.score_dataset(
        input_path, out, f"models:/{MODEL_NAME}@champion", world.home, world.settings.tracking_uri, run_id, **kwargs
    )


def _visible(out: Path) -> pd.DataFrame:
    """What a hive-partitioned reader of the output root sees (hidden staging is skipped)."""
    if not out.exists():
        return pd.DataFrame()
    return ds.dataset(str(out), format="parquet", partitioning="hive").to_table().to_pandas()


def test_dask_engine_writes_the_same_output_as_the_local_one(world, two_days, tmp_path):
    local = _score(world, two_days, tmp_path / "local", "same", chunk_rows=700)
    dask = _score(
        world, two_days, tmp_path / "dask", "same", chunk_rows=700, engine="dask", dask=batch.DaskOptions(workers=2)
    )
    assert dask.chunks == local.chunks > 1 and dask.rows == local.rows == len(pd.read_parquet(two_days))

    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))

    assert files(dask.output) == files(local.output)
    assert len({p.split("/")[1] for p in files(local.output)}) == 2  # one partition per date
    key = ["transaction_id"]
    left = pd.read_parquet(local.output).sort_values(key).reset_index(drop=True)
    right = pd.read_parquet(dask.output).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right)
    assert output_layout.read_manifest(dask.output)["engine"] == "dask"


def _cli(world, input_path: Path, out: Path, run_id: str) -> subprocess.Popen[str]:
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ) | {"PREFECT_API_URL": PREFECT_API_URL.value()}  # the session's test server
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "flows.batch_score",
            "--input",
            str(input_path),
            "--output",
            str(out),
            "--model-uri",
            f"models:/{MODEL_NAME}@champion",
            "--run-id",
            run_id,
            "--chunk-rows",
            "40",
        ],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_once_scoring(process: subprocess.Popen[str], out: Path, run_id: str, timeout: float = 240) -> None:
    """SIGKILL the run as soon as its staging directory holds a scored chunk (the run is midway)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(
                f"the run ended (code {process.returncode}) before it could be killed:\n{process.stdout.read()[-3000:]}"
            )
        staged = list(out.glob(f".run={run_id}.*.staging/version=*/date=*/part-*.parquet")) if out.exists() else []
        if staged:
            process.send_signal(signal.SIGKILL)
            process.wait(30)
            process.stdout.close()
            return
        time.sleep(0.05)
    process.kill()
    pytest.fail("the run never started scoring")


def test_a_run_killed_midway_publishes_nothing_and_a_rerun_completes(world, two_days, tmp_path):
    out = tmp_path / "scores"
    rows = len(pd.read_parquet(two_days))

    _kill_once_scoring(_cli(world, two_days, out, "nightly"), out, "nightly")
    assert not output_layout.run_dir(out, "nightly").exists()
    assert _visible(out).empty  # only the hidden staging directory is left
    assert [p.name for p in out.iterdir() if p.name.startswith(".run=nightly.")]

    first = _score(world, two_days, out, "nightly", chunk_rows=400)
    assert first.rows == rows == len(_visible(out))
    assert sorted(p.name for p in out.iterdir()) == ["run=nightly"]  # the killed run's leftovers are gone
    before = output_layout.read_manifest(first.output)

    # a rerun of a published run id, killed midway, leaves the published run as it was
    _kill_once_scoring(_cli(world, two_days, out, "nightly"), out, "nightly")
    assert output_layout.read_manifest(first.output) == before
    visible = _visible(out)
    assert len(visible) == rows and visible["transaction_id"].is_unique

    again = _score(world, two_days, out, "nightly", chunk_rows=400)
    assert again.rows == rows and output_layout.read_manifest(again.output)["finished_at"] != before["finished_at"]
    assert sorted(p.name for p in out.iterdir()) == ["run=nightly"]
    assert len(_visible(out)) == rows


def test_other_runs_are_untouched_by_a_rerun(world, two_days, tmp_path):
    out = tmp_path / "scores"
    _score(world, two_days, out, "a", chunk_rows=5000)
    other = _score(world, two_days, out, "b", chunk_rows=5000)
    manifest_b = output_layout.read_manifest(other.output)
    _score(world, two_days, out, "a", chunk_rows=5000)
    assert output_layout.read_manifest(other.output) == manifest_b
    seen = _visible(out)
    assert seen.groupby("run_id").size().to_dict() == {
        "a": len(pd.read_parquet(two_days)),
        "b": len(pd.read_parquet(two_days)),
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f: f.assign(amount=f["amount"].astype(str)), "request field amount must be numeric"),
        (lambda f: f.assign(event_timestamp=f["event_timestamp"].astype(str)), "event_timestamp must be a timestamp"),
        (
            lambda f: f.assign(customer_id=f["customer_id"].astype(float)),
            "entity key column customer_id must be an integer",
        ),
        (lambda f: f.drop(columns=["transaction_id", "merchant_id"]), "missing column(s): transaction_id, merchant_id"),
        (lambda f: f.head(0), "is empty"),
        (
            lambda f: f.assign(amount=f["amount"].where(f.index % 7 != 0)),
            "amount: ",
        ),  # nulls, found by Great Expectations
    ],
    ids=["string-amount", "string-timestamp", "float-key", "missing-columns", "empty", "null-amount"],
)
def test_bad_input_is_refused_naming_the_problem_before_any_output(world, two_days, tmp_path, mutate, message):
    bad = tmp_path / "bad.parquet"
    mutate(pd.read_parquet(two_days)).to_parquet(bad, index=False)
    with pytest.raises(batch.BatchInputError) as caught:
        _score(world, bad, tmp_path / "out", "bad")
    assert message in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_unknown_version_and_bad_run_id_are_refused_before_any_output(world, two_days, tmp_path):
    with pytest.raises(LookupError, match="models:/fraud/999"):
        batch.score_dataset(
            two_days, tmp_path / "out", f"models:/{MODEL_NAME}/999", world.home, world.settings.tracking_uri, "x"
        )
    with pytest.raises(ValueError, match="run id"):
        _score(world, two_days, tmp_path / "out", "../escape")
    with pytest.raises(ValueError, match="engine"):
        _score(world, two_days, tmp_path / "out", "x", engine="spark")
    assert not (tmp_path / "out").exists()


def test_the_cli_exits_2_naming_an_unknown_alias(world, two_days, tmp_path):
    from prefect.settings import PREFECT_API_URL

    env = dict(os.environ) | {"PREFECT_API_URL": PREFECT_API_URL.value()}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.batch_score",
            "--input",
            str(two_days),
            "--output",
            str(tmp_path / "out"),
            "--model-uri",
            f"models:/{MODEL_NAME}@nope",
        ],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "models:/fraud@nope" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_flow_reports_progress_as_a_prefect_artifact(world, two_days, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from flows.batch_score import batch_score

    result = batch_score(input_path=str(two_days), output=str(tmp_path / "out"), run_id="Progress_1", chunk_rows=800)
    assert result["rows"] == len(pd.read_parquet(two_days))
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["batch-score-progress-1"]))
        )
    assert [a.type for a in found] == ["progress"] and float(found[0].data) == 100.0
