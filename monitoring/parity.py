"""Feature parity: do the features serving used equal the offline features at the same time?

Pure: two aligned frames in, a mismatch rate per feature out. Integers and strings must match
exactly, floats within a relative tolerance (1e-6 by default). Used by the parity test and by the
skew flow on a sample of logged requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class FeatureParity:
    feature: str
    compared: int
    mismatches: int
    first_mismatch_row: int | None

    @property
    def rate(self) -> float:
        return self.mismatches / self.compared if self.compared else 0.0


@dataclass(frozen=True)
class ParityResult:
    features: tuple[FeatureParity, ...]
    rows: int

    def mismatched(self) -> list[str]:
        return [f.feature for f in self.features if f.mismatches]

    def table(self) -> list[dict[str, Any]]:
        return [
            {"feature": f.feature, "compared": f.compared, "mismatches": f.mismatches, "rate": round(f.rate, 6)}
            for f in self.features
        ]


def _equal(a: Any, b: Any, rel_tol: float) -> bool:
    a_missing = a is None or (isinstance(a, float) and math.isnan(a))
    b_missing = b is None or (isinstance(b, float) and math.isnan(b))
    if a_missing or b_missing:
        return a_missing and b_missing
    if isinstance(a, (float, np.floating)) or isinstance(b, (float, np.floating)):
        try:
            return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        return int(a) == int(b)
    return str(a) == str(b)


def compare_features(
    served: pd.DataFrame, offline: pd.DataFrame, features: list[str], rel_tol: float = 1e-6
) -> ParityResult:
    """Per-feature mismatch counts between row-aligned ``served`` and ``offline`` frames."""
    if len(served) != len(offline):
        raise ValueError(f"parity needs aligned frames: {len(served)} served rows vs {len(offline)} offline rows")
    missing = [f for f in features if f not in served.columns or f not in offline.columns]
    if missing:
        raise ValueError(f"features missing from the served or offline frame: {', '.join(missing)}")
    results = []
    for feature in features:
        pairs = zip(served[feature].tolist(), offline[feature].tolist())
        bad = [i for i, (a, b) in enumerate(pairs) if not _equal(a, b, rel_tol)]
        results.append(FeatureParity(feature, len(served), len(bad), bad[0] if bad else None))
    return ParityResult(tuple(results), len(served))
