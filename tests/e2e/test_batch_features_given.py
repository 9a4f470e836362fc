"""Batch scoring of a model registered without a FeatureService: the input carries the model's columns.

The champion's fitted model is logged again with the same signature but no ``feature_service`` tag
or metadata (``fraud_plain``), and once more without a signature (``fraud_unsigned``). The input is
a features dataset: the point-in-time features of two days of transactions, as a feature pipeline
would hand them over, with the row key and ``event_timestamp``.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from feature_repo import store as feature_store
from flows import training
from serving import batch
from serving.batch import output_layout
from serving.registry import versions
from tests.world import MODEL_NAME, two_days_of_transactions

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("inline_validation")]
SERVICE = "fraud_v1"
PLAIN = "fraud_plain"
UNSIGNED = "fraud_unsigned"


def _log_again(world, name: str, with_signature: bool) -> str:
    """The champion's fitted model logged under ``name`` without a FeatureService; its version."""
    import sklearn

    from flows.train import SKOPS_TRUSTED_TYPES

    champion = f"models:/{MODEL_NAME}/{world.trained['version']}"
    mlflow.set_tracking_uri(world.settings.tracking_uri)
    client = mlflow.MlflowClient(world.settings.tracking_uri)
    experiment = versions.ensure_experiment(client, "batch-features-given", world.settings.artifacts_dir)
    with mlflow.start_run(experiment_id=experiment):
        info = mlflow.sklearn.log_model(
            mlflow.sklearn.load_model(champion),
            name="model",
            signature=mlflow.models.get_model_info(champion).signature if with_signature else None,
            pip_requirements=[f"scikit-learn=={sklearn.__version__}", f"mlflow=={mlflow.__version__}"],
            pyfunc_predict_fn="predict_proba",
            skops_trusted_types=SKOPS_TRUSTED_TYPES,
            registered_model_name=name,
        )
    version = str(info.registered_model_version)
    assert "feature_service" not in client.get_model_version(name, version).tags
    return version


@pytest.fixture(scope="module")
def plain(world) -> str:
    return f"models:/{PLAIN}/{_log_again(world, PLAIN, with_signature=True)}"


@pytest.fixture(scope="module")
def unsigned(world) -> str:
    return f"models:/{UNSIGNED}/{_log_again(world, UNSIGNED, with_signature=False)}"


@pytest.fixture(scope="module")
def names(world) -> list[str]:
    model = mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}/{world.trained['version']}")
    return list(model.metadata.get_input_schema().input_names())


@pytest.fixture(scope="module")
def entity_keys(world, tmp_path_factory) -> Path:
    """Two days of transactions (two date partitions): what the FeatureService path is given."""
    return two_days_of_transactions(
        world, tmp_path_factory.mktemp("given") / "entity_keys.parquet", ["transaction_id", *training.REQUEST_COLUMNS]
    )


@pytest.fixture(scope="module")
def features(world, entity_keys, names) -> Path:
    """The same rows' point-in-time features, with the row key, the timestamp and the request columns."""
    rows = pd.read_parquet(entity_keys)
    frame = training.historical_features(feature_store.open_store(world.home), SERVICE, training.entity_frame(rows))
    path = entity_keys.parent / "features.parquet"
    frame[list(dict.fromkeys(["transaction_id", "event_timestamp", "customer_id", *names]))].to_parquet(
        path, index=False
    )
    return path


def _score(world, input_path: Path, out: Path, model_uri: str, run_id: str = "given", **kwargs):
    return batch.score_dataset(input_path, out, model_uri, world.home, world.settings.tracking_uri, run_id, **kwargs)


def _no_feature_store(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the feature store was opened for a model without a FeatureService")

    monkeypatch.setattr(feature_store, "open_store", refuse)


def test_features_given_are_scored_like_pyfunc_without_opening_the_feature_store(
    world, plain, entity_keys, features, names, tmp_path, monkeypatch
):
    from flows.batch_score import batch_score

    joined = _score(world, entity_keys, tmp_path / "joined", f"models:/{MODEL_NAME}@champion", "joined", chunk_rows=700)

    _no_feature_store(monkeypatch)
    result = batch_score(
        input_path=str(features), output=str(tmp_path / "out"), model_uri=plain, run_id="given", chunk_rows=700
    )
    source = pd.read_parquet(features)
    scored = pd.read_parquet(result["output"])
    assert len(scored) == len(source) == result["rows"] and result["rows_without_features"] == 0
    assert scored["transaction_id"].is_unique and set(scored["transaction_id"]) == set(source["transaction_id"])

    model = mlflow.pyfunc.load_model(plain)
    expected = pd.Series(np.asarray(model.predict(source[names]))[:, 1], index=source["transaction_id"])
    got = scored.set_index("transaction_id")["prediction"]
    np.testing.assert_allclose(got.to_numpy(), expected.loc[got.index].to_numpy(), rtol=1e-9)

    manifest = output_layout.read_manifest(Path(result["output"]))
    assert manifest["feature_service"] is None and manifest["regrouped_by"] is None
    assert manifest["pinned_model_uri"] == plain and manifest["rows"] == len(source) and manifest["chunk_rows"] == 700
    assert manifest["stage_seconds"]["features"] == 0.0 and set(manifest["stage_seconds"]) == {
        "read",
        "features",
        "predict",
        "write",
    }

    # the same rows through the FeatureService path: same layout, same columns and types, same scores
    def parts(root: Path) -> list[Path]:
        return sorted(root.rglob("*.parquet"))

    assert {p.parent.name for p in parts(joined.output)} == {p.parent.name for p in parts(Path(result["output"]))}
    assert len({p.parent.name for p in parts(joined.output)}) == 2
    assert (
        pq.read_schema(parts(joined.output)[0]).remove_metadata()
        == pq.read_schema(parts(Path(result["output"]))[0]).remove_metadata()
    )
    via_join = pd.read_parquet(joined.output).set_index("transaction_id")
    np.testing.assert_allclose(got.to_numpy(), via_join.loc[got.index, "prediction"].to_numpy(), rtol=1e-9)
    pd.testing.assert_series_equal(
        scored.set_index("transaction_id")["event_timestamp"], via_join.loc[got.index, "event_timestamp"]
    )


def test_features_given_rerun_replaces_its_own_output(world, plain, features, tmp_path):
    out = tmp_path / "scores"
    first = _score(world, features, out, plain, "nightly", chunk_rows=500)
    again = _score(world, features, out, plain, "nightly", chunk_rows=500)
    assert again.rows == first.rows == len(pd.read_parquet(features))
    assert sorted(p.name for p in out.iterdir()) == ["run=nightly"]
    assert len(pd.read_parquet(again.output)) == first.rows


def _drop(column: str):
    return lambda f, names: f.drop(columns=[column])


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda f, names: f.drop(columns=[names[0]]), lambda names: f"missing column(s): {names[0]}"),
        (
            lambda f, names: f.drop(columns=[names[-1], "transaction_id"]),
            lambda names: f"missing column(s): transaction_id, {names[-1]}",
        ),
        (_drop("event_timestamp"), lambda names: "missing column(s): event_timestamp"),
        (
            lambda f, names: f.assign(**{names[0]: f[names[0]].astype(str)}),
            lambda names: f"model input column {names[0]} must be",
        ),
        (
            lambda f, names: f.assign(cust_txn_count_1h=f["cust_txn_count_1h"].astype(float)),
            lambda names: "model input column cust_txn_count_1h must be an integer",
        ),
        (lambda f, names: f.assign(**{names[0]: f[names[0]].where(f.index % 5 != 0)}), lambda names: f"{names[0]}: "),
        (lambda f, names: f.head(0), lambda names: "is empty"),
    ],
    ids=[
        "missing-signature-column",
        "missing-key-and-column",
        "missing-timestamp",
        "string-feature",
        "float-count",
        "null-feature",
        "empty",
    ],
)
def test_bad_features_input_is_refused_naming_the_column_before_any_output(
    world, plain, features, names, tmp_path, monkeypatch, mutate, message
):
    bad = tmp_path / "bad.parquet"
    frame = pd.read_parquet(features)
    mutate(frame, names).to_parquet(bad, index=False)
    _no_feature_store(monkeypatch)
    with pytest.raises(batch.BatchInputError) as caught:
        _score(world, bad, tmp_path / "out", plain)
    text = str(caught.value)
    assert message(names) in text and str(bad) in text
    for value in frame[names[0]].astype(str).head(20):  # errors never quote row values
        assert len(value) < 5 or value not in text
    assert not (tmp_path / "out").exists()


def test_a_null_feature_refused_by_the_suite_in_its_child_fails_the_run_with_its_message_and_leaves_nothing(
    world, plain, features, names, tmp_path, monkeypatch
):
    # the chunks are scored while the child validates; this model's predict fails on the nulls too (NaN), and the
    # run must still name the column the suite refuses, however the two race
    bad = tmp_path / "bad.parquet"
    frame = pd.read_parquet(features)
    frame.assign(**{names[0]: frame[names[0]].where(frame.index % 5 != 0)}).to_parquet(bad, index=False)
    _no_feature_store(monkeypatch)
    with pytest.raises(batch.BatchInputError) as caught:
        _score(world, bad, tmp_path / "out", plain, validation="process", chunk_rows=500)
    assert f"{names[0]}: " in str(caught.value) and str(bad) in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_a_model_with_neither_feature_service_nor_signature_is_refused_naming_it(world, unsigned, features, tmp_path):
    with pytest.raises(ValueError, match=f"{unsigned}.*neither a feature service nor a signature"):
        _score(world, features, tmp_path / "out", unsigned)
    assert not (tmp_path / "out").exists()


def test_dask_engine_writes_the_same_features_given_output_as_the_local_one(world, plain, features, tmp_path):
    local = _score(world, features, tmp_path / "local", plain, "same", chunk_rows=700)
    dask = _score(
        world,
        features,
        tmp_path / "dask",
        plain,
        "same",
        chunk_rows=700,
        engine="dask",
        dask=batch.DaskOptions(workers=1),  # one worker process: the features-given path, not the spread, is tested
    )
    assert dask.chunks == local.chunks > 1 and dask.rows == local.rows

    def files(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*.parquet"))

    assert files(dask.output) == files(local.output)
    pd.testing.assert_frame_equal(
        pd.read_parquet(local.output).sort_values("transaction_id").reset_index(drop=True),
        pd.read_parquet(dask.output).sort_values("transaction_id").reset_index(drop=True),
    )
