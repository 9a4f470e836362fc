"""Models the tests register: deliberately bad ones for the promotion gates (slow, unfair, broken), and small
ones whose answers a test can predict (a cost per row, traps, mixed column types).

They live in an importable module so the pickled models load in a replica process too.
"""

from __future__ import annotations

import time
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd


class SleepyModel(mlflow.pyfunc.PythonModel):
    """The champion's sklearn model, plus a sleep per call: what a slow candidate looks like."""

    def __init__(self, sleep_s: float) -> None:
        self.sleep_s = sleep_s

    def load_context(self, context: Any) -> None:
        self.inner = mlflow.pyfunc.load_model(context.artifacts["inner"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        time.sleep(self.sleep_s)
        return np.asarray(self.inner.predict(model_input))


class UnfairModel(mlflow.pyfunc.PythonModel):
    """Flags the youngest age group far more often: the kind of model a fairness gate must stop."""

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        young = (model_input["age_group"] == "18-25").to_numpy()
        p = np.where(young, 0.9, 0.01) * np.clip(model_input["amount_to_mean_7d"].to_numpy(), 0.5, 1.0)
        return np.column_stack([1 - p, p])


class BrokenOnLoad(mlflow.pyfunc.PythonModel):
    """A model whose replica can never become ready: loading it fails."""

    def load_context(self, context: Any) -> None:
        raise RuntimeError("this model cannot be loaded")

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        return np.zeros(len(model_input))


class FlakyModel(mlflow.pyfunc.PythonModel):
    """The champion's model, failing on about one row in ten (a deterministic function of the input)."""

    def load_context(self, context: Any) -> None:
        self.inner = mlflow.pyfunc.load_model(context.artifacts["inner"])

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        marks = (np.floor(model_input["log_amount"].to_numpy(dtype=float) * 1e4) % 10) == 0
        if marks.any():
            raise ValueError("this model fails on some inputs")
        return np.asarray(self.inner.predict(model_input))


class RowCostModel(mlflow.pyfunc.PythonModel):
    """Costs ``per_row_s`` of wall time per row, in one thread: a replica serves one request at a time
    and batching gains nothing. What the autoscaler's horizontal axis must add replicas for."""

    def __init__(self, per_row_s: float) -> None:
        self.per_row_s = per_row_s

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        time.sleep(self.per_row_s * len(model_input))
        return model_input["x"].to_numpy(dtype=float) * 2


class TrapModel(mlflow.pyfunc.PythonModel):
    """``2 x`` for any ``x``, except two traps: ``x == 7`` raises (with a detail no client may see) and
    ``x == 13`` sleeps ``hang_s`` (longer than the gateway's request timeout)."""

    def __init__(self, hang_s: float) -> None:
        self.hang_s = hang_s

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        x = model_input["x"].to_numpy(dtype=float)
        if (x == 7).any():
            raise RuntimeError("internal model detail SECRET-MODEL-DETAIL")
        if (x == 13).any():
            time.sleep(self.hang_s)
        return x * 2


def register_row_cost_model(tracking_uri: str, name: str, per_row_s: float, experiment_of: str = "fraud") -> str:
    """A ``RowCostModel`` logged in the experiment of ``experiment_of``'s champion and registered as ``name``;
    its version."""
    return register_x_model(tracking_uri, name, RowCostModel(per_row_s), experiment_of)


def register_x_model(
    tracking_uri: str, name: str, model: mlflow.pyfunc.PythonModel, experiment_of: str = "fraud"
) -> str:
    """A model of one double column ``x`` (``RowCostModel``, ``TrapModel``) logged in the experiment of
    ``experiment_of``'s champion and registered as ``name``; its version."""
    from mlflow import MlflowClient
    from mlflow.models import infer_signature

    client = MlflowClient(tracking_uri)
    champion = client.get_model_version_by_alias(experiment_of, "champion")
    frame = pd.DataFrame({"x": [1.0]})
    with mlflow.start_run(experiment_id=client.get_run(champion.run_id).info.experiment_id):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=model,
            pip_requirements=["mlflow"],
            signature=infer_signature(frame, [2.0]),
            input_example=frame,
            registered_model_name=name,
        )
    return str(info.registered_model_version)


class MixedColumnsModel(mlflow.pyfunc.PythonModel):
    """A score from columns of four types (double, long, boolean, string), each of which moves it: what the Open
    Inference Protocol's datatypes must reach the model as."""

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict | None = None) -> np.ndarray:
        return (
            model_input["amount"].to_numpy(dtype=float) * model_input["count"].to_numpy(dtype=float)
            + model_input["city"].str.len().to_numpy(dtype=float)
            + np.where(model_input["flag"].to_numpy(dtype=bool), 0.5, 0.0)
        )


def register_mixed_columns_model(tracking_uri: str, name: str, experiment_of: str = "fraud") -> str:
    """A ``MixedColumnsModel`` with its signature (amount: double, count: long, flag: boolean, city: string; a
    double out), registered as ``name`` in the experiment of ``experiment_of``'s champion; its version."""
    from mlflow import MlflowClient
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    client = MlflowClient(tracking_uri)
    champion = client.get_model_version_by_alias(experiment_of, "champion")
    signature = ModelSignature(
        inputs=Schema(
            [
                ColSpec("double", "amount"),
                ColSpec("long", "count"),
                ColSpec("boolean", "flag"),
                ColSpec("string", "city"),
            ]
        ),
        outputs=Schema([ColSpec("double")]),
    )
    with mlflow.start_run(experiment_id=client.get_run(champion.run_id).info.experiment_id):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=MixedColumnsModel(),
            pip_requirements=["mlflow"],
            signature=signature,
            registered_model_name=name,
        )
    return str(info.registered_model_version)
