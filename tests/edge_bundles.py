"""Small edge bundles for the device's tests, made the way ``serving.edge.bundling`` makes them (skl2onnx, a signed
manifest) from a tiny scikit-learn model, without a registry."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tollfree_edge import bundle

INPUTS = ["amount", "hour", "velocity"]


def _model(seed: int):  # type: ignore[no-untyped-def]
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(400, len(INPUTS)))
    labels = (rows @ rng.normal(size=len(INPUTS)) > 0).astype(int)
    return LogisticRegression().fit(rows, labels), rows.astype(np.float32)


def onnx_of(seed: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """An ONNX model of ``seed``'s logistic regression, its rows and the original's probabilities for them."""
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    model, rows = _model(seed)
    onx = convert_sklearn(
        model,
        initial_types=[("input", FloatTensorType([None, len(INPUTS)]))],
        options={id(model): {"zipmap": False}},
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    return onx.SerializeToString(), rows, model.predict_proba(rows)


def write_bundle(
    out: Path, key: Ed25519PrivateKey, version: str, seed: int = 1, *, expected_from: int | None = None
) -> Path:
    """A signed bundle file of ``seed``'s model as ``version``. ``expected_from``: smoke answers taken from another
    seed's model, so the bundle is well signed but fails its smoke test on the device (a bad bundle)."""
    model, rows, expected = onnx_of(seed)
    if expected_from is not None:
        _, _, expected = onnx_of(expected_from)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / bundle.MODEL).write_bytes(model)
        manifest = {
            "format": bundle.FORMAT,
            "model": "tiny",
            "version": version,
            "inputs": INPUTS,
            "output": "probabilities",
            "tolerance": {"allowed": 1e-4, "measured": 0.0, "rows": len(rows)},
            "smoke": {"rows": rows[:5].tolist(), "expected": expected[:5].tolist()},
            "files": {bundle.MODEL: bundle.sha256(folder / bundle.MODEL)},
        }
        (folder / bundle.MANIFEST).write_text(json.dumps(manifest))
        bundle.sign(folder, key)
        bundle.pack(folder, out)
    return out


def public_pem(key: Ed25519PrivateKey, path: Path) -> Path:
    path.write_bytes(key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return path
