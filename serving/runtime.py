"""A loaded model and how to feed it: MLflow pyfunc, with the FeatureService it was trained on.

A model logged with ``metadata={"feature_service": NAME}`` receives entity keys and request-time
fields; the runtime fetches its features online through that FeatureService. Any other MLflow model
receives its input columns as sent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from serving.errors import ApiError, invalid_parameter
from serving.online_features import OnlineFeatureReader

log = logging.getLogger(__name__)

FEATURE_SERVICE_KEY = "feature_service"


@dataclass(frozen=True)
class Prediction:
    predictions: Any
    features: pd.DataFrame | None  # what the model was fed, when features came from the store


class ModelError(Exception):
    """The model itself failed on a well-formed input (a 500, not the caller's fault)."""


class ModelRuntime:
    def __init__(self, model: Any, feature_reader: OnlineFeatureReader | None, input_columns: list[str] | None) -> None:
        self._model = model
        self.feature_reader = feature_reader
        self.input_columns = input_columns

    @classmethod
    def load(cls, model_uri: str, home: Path) -> ModelRuntime:
        import mlflow.pyfunc

        model = mlflow.pyfunc.load_model(model_uri)
        metadata = model.metadata.metadata or {}
        service = metadata.get(FEATURE_SERVICE_KEY)
        reader = OnlineFeatureReader.open(home, service) if service else None
        schema = model.metadata.get_input_schema()
        columns = schema.input_names() if schema is not None and schema.has_input_names() else None
        log.info("loaded %s (feature service: %s)", model_uri, service or "none")
        return cls(model, reader, columns)

    @property
    def feature_service(self) -> str | None:
        return self.feature_reader.layout.service_name if self.feature_reader else None

    def model_input(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Features for the model: from the online store, or the request's own columns."""
        if self.feature_reader is not None:
            return self.feature_reader.read(frame)
        if self.input_columns:
            missing = [c for c in self.input_columns if c not in frame.columns]
            if missing:
                raise invalid_parameter(f"input is missing column(s) required by the model's signature: {', '.join(missing[:10])}")
            return frame.loc[:, self.input_columns]
        return frame

    def predict(self, frame: pd.DataFrame, params: dict[str, Any] | None = None) -> Prediction:
        features = self.model_input(frame)
        try:
            predictions = self._model.predict(features, params=params) if params else self._model.predict(features)
        except ApiError:
            raise
        except Exception as exc:
            from mlflow.exceptions import MlflowException

            if isinstance(exc, MlflowException) and exc.error_code == "INVALID_PARAMETER_VALUE":
                # Schema enforcement failed; MLflow's message can quote the input, so name only the kind.
                raise invalid_parameter("input does not match the model's signature (column names or types)") from exc
            raise ModelError(type(exc).__name__) from exc
        return Prediction(predictions, features if self.feature_reader is not None else None)

    def warm(self) -> None:
        """Run the model once on its logged input example so the first request pays no lazy init."""
        example = getattr(self._model, "input_example", None)
        if isinstance(example, pd.DataFrame) and not example.empty:
            self._model.predict(example)
