"""What a registered model takes and gives, as named columns with their types: read from its MLflow signature,
or, for a model trained on a FeatureService, the service's entity keys and request-time fields (the replica fetches
the rest online). The per-endpoint OpenAPI document and the Open Inference Protocol's metadata and input checks
read the same answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.protocol.columns import PREDICTIONS, Column, ModelIO


def model_io(model_uri: str, home: Path) -> ModelIO:
    """The inputs and outputs of the model at ``model_uri`` (reads the registry, and Feast for a FeatureService)."""
    import mlflow.models

    info = mlflow.models.get_model_info(model_uri)
    signature = info.signature
    outputs = _columns(signature.outputs, PREDICTIONS) if signature is not None and signature.outputs else ()
    service = (info.metadata or {}).get("feature_service")
    if service:
        from feature_repo import store as feature_store

        store = feature_store.open_store(home)
        fs = feature_store.feature_service(store, service)
        inputs = [Column(key, "long") for key in feature_store.entity_join_keys(store, fs)]
        inputs += [Column(name, _feast_type(t)) for name, t in feature_store.request_fields(store, fs).items()]
        return ModelIO(tuple(inputs), outputs, str(service))
    if signature is None:
        return ModelIO((), outputs)
    return ModelIO(_columns(signature.inputs, "input"), outputs)


def _columns(schema: Any, unnamed: str) -> tuple[Column, ...]:
    """A signature's schema as columns; a tensor spec is one column of its dtype (its width from its shape), and a
    schema without names gives ``unnamed``, then ``unnamed-1``... for its entries."""
    columns = []
    for i, spec in enumerate(schema.inputs):
        name = spec.name if spec.name else (unnamed if i == 0 else f"{unnamed}-{i}")
        shape = getattr(spec, "shape", None)
        if shape is not None:  # a TensorSpec: numpy dtype, shape (-1,) or (-1, k)
            width = int(shape[1]) if len(shape) == 2 else 1
            columns.append(Column(name, str(spec.type), width))
        else:
            columns.append(Column(name, str(getattr(spec.type, "name", spec.type))))
    return tuple(columns)


_FEAST_TYPES = {"Int64": "long", "Int32": "integer", "Float64": "double", "Float32": "float", "String": "string"}


def _feast_type(feast_type: str) -> str:
    return "boolean" if feast_type == "Bool" else _FEAST_TYPES.get(feast_type, "double")
