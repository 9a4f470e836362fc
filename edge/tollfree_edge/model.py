"""A verified bundle's model: one ONNX Runtime session, answering rows in the manifest's column order.

The session runs on one thread (``intra_op_num_threads=1``): a device's cores serve its other work, and the
HTTP server's threads give the parallelism between requests.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from tollfree_edge.bundle import MODEL, Manifest


class EdgeModel:
    """The model of one bundle, loaded only after ``bundle.verify`` passed on its folder."""

    def __init__(self, folder: Path, manifest: Manifest) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.manifest = manifest
        self.session = ort.InferenceSession(str(folder / MODEL), options, providers=["CPUExecutionProvider"])
        self._input = self.session.get_inputs()[0].name
        self._output = str(manifest.document.get("output", "probabilities"))

    @property
    def version(self) -> str:
        return self.manifest.version

    def predict(self, rows: np.ndarray) -> np.ndarray:
        """The model's answers (one row per input row) for float32 rows in the manifest's input order."""
        (out,) = self.session.run([self._output], {self._input: rows})
        return np.asarray(out)

    def smoke_test(self) -> str | None:
        """None when the smoke rows answer what the original model answered within the bundle's tolerance,
        else what differs."""
        rows = np.asarray(self.manifest.smoke_rows, dtype=np.float32)
        try:
            got = self.predict(rows)
        except Exception as exc:  # whatever the runtime raises, the bundle fails its test
            return f"smoke rows failed to predict ({type(exc).__name__})"
        expected = np.asarray(self.manifest.smoke_expected, dtype=np.float64)
        if got.shape != expected.shape:
            return f"smoke answers have shape {got.shape}, expected {expected.shape}"
        worst = float(np.max(np.abs(got.astype(np.float64) - expected)))
        if not worst <= self.manifest.tolerance:
            return f"smoke answers differ by {worst:.3g}, over the tolerance {self.manifest.tolerance:.3g}"
        return None
