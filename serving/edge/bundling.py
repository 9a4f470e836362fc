"""A registered model version made into an edge bundle (``tollfree_edge.bundle``'s format), or refused.

The steps; the first four name themselves in the refusal (``ConversionRefused.step``) when they fail:

1. ``flavor``: the version must carry MLflow's scikit-learn flavor (the converters below read scikit-learn
   estimators and pipelines);
2. ``load``: the estimator, loaded from the registry;
3. ``convert``: skl2onnx turns it into ONNX (float32 inputs in the signature's column order, class probabilities
   as a plain tensor: no ZipMap);
4. ``verify``: ONNX Runtime answers the version's held-out rows, and the largest difference from the original's
   ``predict_proba`` must be within ``tolerance``;
5. the manifest (model, version, inputs and the signature's input schema, tolerance allowed and measured, smoke
   rows with the original's answers, the FeatureService and its features, sha256 of every file) signed with
   Ed25519, the folder packed.

The bundle is checked with the device's own check (``tollfree_edge.bundle.verify``) before it is returned.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tollfree_edge import bundle as edge_bundle

DEFAULT_TOLERANCE = 1e-4  # the largest difference in a class probability the conversion may make
SMOKE_ROWS = 5  # held-out rows the device answers before it serves a bundle
ONNX_OPSETS = {"": 17, "ai.onnx.ml": 3}


class ConversionRefused(RuntimeError):
    """The version cannot be bundled; ``step`` names where it failed."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step


@dataclass(frozen=True)
class Built:
    archive: Path
    manifest: dict[str, Any]
    sha256: str


def _estimator(model_uri: str) -> Any:
    import mlflow.models
    import mlflow.sklearn

    try:
        flavors = mlflow.models.get_model_info(model_uri).flavors
    except Exception as exc:  # any registry or file error: the step names it
        raise ConversionRefused("flavor", f"cannot read {model_uri}'s MLmodel ({type(exc).__name__})") from None
    if "sklearn" not in flavors:
        raise ConversionRefused(
            "flavor", f"{model_uri} has flavors {sorted(flavors)}; edge bundles convert scikit-learn models"
        )
    try:
        return mlflow.sklearn.load_model(model_uri)
    except Exception as exc:  # a model that does not load is refused, whatever the loader raised
        raise ConversionRefused("load", f"{type(exc).__name__}: {exc}") from None


def _convert(estimator: Any, n_inputs: int) -> bytes:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    try:
        onx = convert_sklearn(
            estimator,
            initial_types=[("input", FloatTensorType([None, n_inputs]))],
            options={id(estimator): {"zipmap": False}},
            target_opset=ONNX_OPSETS,
        )
    except Exception as exc:  # skl2onnx raises many types for an estimator it has no converter for
        raise ConversionRefused("convert", f"skl2onnx: {type(exc).__name__}: {exc}") from None
    return bytes(onx.SerializeToString())


def _onnx_answers(model: bytes, rows: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (out,) = session.run(["probabilities"], {session.get_inputs()[0].name: rows})
    return np.asarray(out, dtype=np.float64)


def build(
    model_uri: str,
    model: str,
    version: str,
    inputs: list[str],
    held_out: pd.DataFrame,
    key: Ed25519PrivateKey,
    out: Path,
    tolerance: float = DEFAULT_TOLERANCE,
    features: dict[str, Any] | None = None,
    schema: list[dict[str, Any]] | None = None,
) -> Built:
    """The bundle of ``model`` ``version`` written to ``out`` (a tar file), or ``ConversionRefused``. ``schema``: the
    signature's input columns with their types (MLflow's ``Schema.to_dict``), kept in the manifest for callers:
    the device reads every input as float32."""
    missing = [c for c in inputs if c not in held_out.columns]
    if missing or held_out.empty:
        raise ConversionRefused("verify", f"the held-out rows lack input columns {missing} (or are none)")
    estimator = _estimator(model_uri)
    onnx_model = _convert(estimator, len(inputs))
    frame = held_out[inputs].astype(np.float32)
    try:
        original = np.asarray(estimator.predict_proba(frame), dtype=np.float64)
        converted = _onnx_answers(onnx_model, frame.to_numpy())
    except Exception as exc:  # the converted model fails to run: refused at this step
        raise ConversionRefused("verify", f"{type(exc).__name__}: {exc}") from None
    if converted.shape != original.shape:
        raise ConversionRefused("verify", f"ONNX answers have shape {converted.shape}, the original {original.shape}")
    diff = np.abs(converted - original).max(axis=1)
    worst = int(diff.argmax())
    if not diff[worst] <= tolerance:
        raise ConversionRefused(
            "verify", f"held-out row {worst} differs by {diff[worst]:.3g}, over the tolerance {tolerance:.3g}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / edge_bundle.MODEL).write_bytes(onnx_model)
        manifest = {
            "format": edge_bundle.FORMAT,
            "model": model,
            "version": version,
            "created": datetime.now(UTC).isoformat(),
            "inputs": inputs,
            "schema": schema or [],
            "output": "probabilities",
            "tolerance": {"allowed": tolerance, "measured": float(diff.max()), "rows": len(frame)},
            "smoke": {"rows": frame.head(SMOKE_ROWS).to_numpy().tolist(), "expected": original[:SMOKE_ROWS].tolist()},
            "features": features or {},
            "files": {edge_bundle.MODEL: edge_bundle.sha256(folder / edge_bundle.MODEL)},
        }
        (folder / edge_bundle.MANIFEST).write_text(json.dumps(manifest, indent=1))
        edge_bundle.sign(folder, key)
        edge_bundle.verify(folder, key.public_key())  # the device's own check, before anything ships
        out.parent.mkdir(parents=True, exist_ok=True)
        edge_bundle.pack(folder, out)
    return Built(out, manifest, edge_bundle.sha256(out))
