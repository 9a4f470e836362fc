"""Model replication between two real MLflow registries (SQLite): the world's, and a second region's.

A model of its own (``fraud_region``, versions registered from the world champion's files), so other tests'
champion is never moved. The interruption is a real ``kill -9`` of a process replicating, at the moment the
copy exists in the target but is not verified yet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from flows.replicate import main, replicate
from serving.registry import versions
from serving.registry.replication import DIGEST_TAG, SOURCE_TAG, VERIFIED_TAG, ReplicationRefused, tree_digest
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

MODEL = "fraud_region"
GATES = {"gate.quality": "pass", "gate.quality.value": "pr_auc=0.4", "gate.data": "pass", "feature_service": "fraud_v1"}

# Run in a process of its own: replicate, and die by SIGKILL right after the target's copy was created.
KILLED_MIDWAY = """
import os, signal, sys
from mlflow import MlflowClient
from serving.registry import replication

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

replication._verify = die
source, target = MlflowClient(sys.argv[1], sys.argv[1]), MlflowClient(sys.argv[2], sys.argv[2])
version = source.get_model_version_by_alias(sys.argv[3], "champion")
replication.replicate_version(source, target, sys.argv[2], sys.argv[3], version)
"""


@pytest.fixture(scope="module")
def source(world) -> MlflowClient:
    client = MlflowClient(world.settings.tracking_uri, world.settings.tracking_uri)
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    client.create_registered_model(MODEL, tags={"team": "risk"})
    for _ in range(3):
        client.create_model_version(MODEL, champion.source, run_id=champion.run_id, tags=GATES)
    client.set_model_version_tag(MODEL, "3", "gate.fairness", "fail")
    client.set_registered_model_alias(MODEL, "champion", "1")
    return client


@pytest.fixture
def region_b(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'region-b' / 'mlflow.db'}"


def _downloaded_digest(client: MlflowClient, version: str) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        uri = client.get_model_version_download_uri(MODEL, version)
        return tree_digest(
            Path(mlflow.artifacts.download_artifacts(uri, dst_path=scratch, tracking_uri=client.tracking_uri))
        )


def test_a_gated_version_is_copied_verified_then_aliased_and_a_rerun_creates_nothing(world, source, region_b):
    (region_b_dir := Path(region_b.removeprefix("sqlite:///")).parent).mkdir()
    (first,) = replicate(MODEL, "champion", [region_b], world.settings.tracking_uri)
    target = MlflowClient(region_b, region_b)
    copy = target.get_model_version_by_alias(MODEL, "champion")
    assert first["created"] and str(copy.version) == first["target_version"] == "1"
    assert copy.tags[VERIFIED_TAG] == copy.tags[DIGEST_TAG] == first["digest"] == _downloaded_digest(source, "1")
    assert copy.tags["gate.quality.value"] == "pr_auc=0.4" and copy.tags["feature_service"] == "fraud_v1"
    assert copy.tags[SOURCE_TAG].startswith(f"{MODEL}/1@")
    assert Path(target.get_run(str(copy.run_id)).info.artifact_uri.removeprefix("file://")).is_relative_to(
        region_b_dir / "mlartifacts"
    )  # beside the target's database, never the caller's ./mlruns
    assert (
        target.get_run(str(copy.run_id)).data.metrics
        == source.get_run(str(source.get_model_version(MODEL, "1").run_id)).data.metrics
    )
    served = mlflow.models.get_model_info(f"models:/{MODEL}/1")
    with tempfile.TemporaryDirectory() as scratch:
        copied = Path(mlflow.artifacts.download_artifacts(copy.source, dst_path=scratch, tracking_uri=region_b))
        model = mlflow.models.Model.load(copied / "MLmodel")
        assert model.signature == served.signature and model.saved_input_example_info is not None
        example = model.load_input_example(str(copied))
        loaded = mlflow.pyfunc.load_model(str(copied))
        original = mlflow.pyfunc.load_model(f"models:/{MODEL}/1")
        np.testing.assert_array_equal(np.asarray(loaded.predict(example)), np.asarray(original.predict(example)))

    (again,) = replicate(MODEL, "champion", [region_b], world.settings.tracking_uri)
    assert not again["created"] and again["target_version"] == "1" and again["alias_moved_from"] is None
    assert len(target.search_model_versions(f"name='{MODEL}'")) == 1


def test_a_version_whose_gates_failed_is_refused_and_nothing_is_copied(world, source, region_b):
    Path(region_b.removeprefix("sqlite:///")).parent.mkdir()
    source.set_registered_model_alias(MODEL, "challenger", "3")
    with pytest.raises(ReplicationRefused, match="gates did not pass: fairness"):
        replicate(MODEL, "challenger", [region_b], world.settings.tracking_uri)
    assert MlflowClient(region_b, region_b).search_registered_models(f"name='{MODEL}'") == []
    assert (
        main(["--model", MODEL, "--alias", "challenger", "--to", region_b, "--from", world.settings.tracking_uri]) == 1
    )


def test_a_replication_killed_midway_leaves_the_alias_and_a_rerun_completes_it(world, source, region_b):
    Path(region_b.removeprefix("sqlite:///")).parent.mkdir()
    replicate(MODEL, "champion", [region_b], world.settings.tracking_uri)  # region B serves v1
    source.set_registered_model_alias(MODEL, "champion", "2")  # a promotion in region A
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_MIDWAY, world.settings.tracking_uri, region_b, MODEL],
        env=os.environ, capture_output=True, timeout=120,
    )  # fmt: skip
    assert killed.returncode == -9, killed.stderr[-2000:]
    target = MlflowClient(region_b, region_b)
    assert versions.aliases(target, MODEL) == {"champion": "1"}
    (half,) = [v for v in target.search_model_versions(f"name='{MODEL}'") if str(v.version) == "2"]
    assert VERIFIED_TAG not in half.tags and half.tags[SOURCE_TAG].startswith(f"{MODEL}/2@")

    (done,) = replicate(MODEL, "champion", [region_b], world.settings.tracking_uri)
    assert not done["created"] and done["target_version"] == "2" and done["alias_moved_from"] == "1"
    assert versions.aliases(target, MODEL) == {"champion": "2", "previous": "1"}
    assert len(target.search_model_versions(f"name='{MODEL}'")) == 2
    assert target.get_model_version(MODEL, "2").tags[VERIFIED_TAG] == _downloaded_digest(source, "2")
