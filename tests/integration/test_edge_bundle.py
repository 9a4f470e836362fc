"""The edge bundle flow on the world's model, against the real registry: converted, verified on the version's
held-out rows, signed, logged with the version; and refused, naming the step, for a model that is not
scikit-learn, one skl2onnx cannot convert, a tolerance the conversion misses and a version whose gates did not
pass."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from flows.edge_bundle import edge_bundle
from flows.edge_bundle import main as edge_bundle_main
from serving.edge import bundling
from serving.edge.bundle_files import BUNDLE_TAG, SHA_TAG, BundleFiles
from serving.edge.signing import public_key_path
from serving.registry.replication import ReplicationRefused
from tests.world import MODEL_NAME, World, champion_copy
from tollfree_edge.bundle import load_public_key, unpack, verify
from tollfree_edge.model import EdgeModel

GATES = {"gate.quality": "pass", "gate.data": "pass"}


def test_the_champion_is_bundled_verified_signed_and_logged_and_its_onnx_answers_match(
    world: World, tmp_path: Path
) -> None:
    client = MlflowClient(world.settings.tracking_uri)
    version = champion_copy(client, "fraud_edge", GATES, source_tags=True)
    key = tmp_path / "keys" / "signing-key.pem"
    done = edge_bundle("fraud_edge", "champion", key_path=str(key))
    assert done["version"] == version and done["measured"] <= bundling.DEFAULT_TOLERANCE
    tags = client.get_model_version("fraud_edge", version).tags
    assert tags[BUNDLE_TAG] == done["artifact"] == f"edge/fraud_edge-{version}.tar" and tags[SHA_TAG] == done["sha256"]

    archive = BundleFiles(world.settings.tracking_uri, tmp_path / "cache").path("fraud_edge", version)
    folder = tmp_path / "bundle"
    unpack(archive, folder)
    manifest = verify(folder, load_public_key(public_key_path(key)))
    doc = manifest.document
    assert doc["model"] == "fraud_edge" and doc["version"] == version
    assert [c["name"] for c in doc["schema"]] == list(manifest.inputs) and {c["type"] for c in doc["schema"]} <= {
        "long",
        "double",
        "integer",
        "float",
    }
    assert doc["tolerance"]["rows"] > 100 and doc["tolerance"]["measured"] <= doc["tolerance"]["allowed"]
    kinds = {v["name"]: v["kind"] for v in doc["features"]["views"]}
    assert doc["features"]["service"] == "fraud_v1" and "on_demand" in kinds.values() and "batch" in kinds.values()
    # the device's own model answers as the original on the held-out rows
    run_id = client.get_model_version("fraud_edge", version).run_id
    held_out = pd.read_parquet(client.download_artifacts(run_id, "evaluation/eval.parquet", str(tmp_path)))
    original = mlflow.sklearn.load_model(f"models:/fraud_edge/{version}")
    rows = held_out[list(manifest.inputs)].astype(np.float32)
    assert np.abs(EdgeModel(folder, manifest).predict(rows.to_numpy()) - original.predict_proba(rows)).max() <= 1e-4
    assert EdgeModel(folder, manifest).smoke_test() is None

    again = edge_bundle("fraud_edge", "champion", key_path=str(key))  # bundled already: left as it is
    assert again["sha256"] == done["sha256"] and again["measured"] is None


def test_a_version_the_converter_or_its_check_cannot_take_is_refused_naming_the_step(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import FunctionTransformer

    client = MlflowClient(world.settings.tracking_uri)
    key = str(tmp_path / "signing-key.pem")
    version = champion_copy(client, "fraud_edge_strict", GATES, source_tags=True)
    with pytest.raises(bundling.ConversionRefused, match=r"^verify: held-out row \d+ differs by .* over the tolerance"):
        edge_bundle("fraud_edge_strict", "champion", tolerance=1e-12, key_path=key)
    assert BUNDLE_TAG not in client.get_model_version("fraud_edge_strict", version).tags

    champion_copy(client, "fraud_edge_ungated", {"gate.quality": "fail"}, source_tags=True)
    assert edge_bundle_main(["--model", "fraud_edge_ungated", "--key", key]) == 1
    assert "gates did not pass: quality" in capsys.readouterr().err
    with pytest.raises(ReplicationRefused):
        edge_bundle("fraud_edge_ungated", "champion", key_path=key)

    # a scikit-learn pipeline with a Python function in it (skl2onnx has no converter for it), and a model that is
    # no scikit-learn model at all: each logged with held-out rows, as the train flow logs them
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    inputs = mlflow.models.get_model_info(f"models:/{MODEL_NAME}/{champion.version}").signature.inputs.input_names()
    rows = pd.DataFrame(np.random.default_rng(0).uniform(size=(50, len(inputs))), columns=inputs)
    # an experiment of the test's own: the default one's artifacts would land in ./mlruns of the working directory
    experiment = client.create_experiment(f"edge-refusals-{tmp_path.name}", artifact_location=tmp_path.as_uri())
    held_out = tmp_path / "eval.parquet"
    rows.to_parquet(held_out)
    custom = make_pipeline(FunctionTransformer(np.log1p), LogisticRegression()).fit(rows, rows.iloc[:, 0] > 0.5)
    signature = mlflow.models.infer_signature(rows, custom.predict_proba(rows))
    for name, log in (
        (
            "fraud_edge_custom",
            lambda: mlflow.sklearn.log_model(
                custom, name="model", signature=signature, serialization_format="cloudpickle", pip_requirements=[]
            ),
        ),
        (
            "fraud_edge_pyfunc",
            lambda: mlflow.pyfunc.log_model(
                name="model", python_model=_Constant(), signature=signature, pip_requirements=[]
            ),
        ),
    ):  # fmt: skip (a signature and requirements given: MLflow infers neither, which takes seconds)
        with mlflow.start_run(experiment_id=experiment) as run:
            info = log()
            mlflow.log_artifact(str(held_out), "evaluation")
        if not client.search_registered_models(f"name='{name}'"):
            client.create_registered_model(name)
        made = client.create_model_version(name, info.model_uri, run_id=run.info.run_id, tags=GATES)
        client.set_registered_model_alias(name, "champion", str(made.version))
    with pytest.raises(bundling.ConversionRefused, match=r"^convert: skl2onnx: ") as refused:
        edge_bundle("fraud_edge_custom", "champion", key_path=key)
    assert refused.value.step == "convert"
    with pytest.raises(bundling.ConversionRefused, match=r"^flavor: .* edge bundles convert scikit-learn models"):
        edge_bundle("fraud_edge_pyfunc", "champion", key_path=key)


class _Constant(mlflow.pyfunc.PythonModel):
    def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
        return np.zeros(len(model_input))
