"""A model's inputs and outputs as named, typed columns: what the per-endpoint OpenAPI document and the Open
Inference Protocol's metadata and checks describe (read from the registry by ``serving.endpoints.model_io``)."""

from __future__ import annotations

from dataclasses import dataclass

PREDICTIONS = "predictions"  # the one output of a model whose signature names none, as the MLflow route answers


@dataclass(frozen=True)
class Column:
    """One named input or output: ``type`` is MLflow's schema type name (``long``, ``double``, ``string``...) or a
    numpy dtype name for a tensor; ``width`` is the values per row (1 for a column; a tensor's second dimension,
    -1 when variable)."""

    name: str
    type: str
    width: int = 1


@dataclass(frozen=True)
class ModelIO:
    inputs: tuple[Column, ...]  # empty: the model declares none (anything is sent on, the replica checks it)
    outputs: tuple[Column, ...]
    feature_service: str | None = None
