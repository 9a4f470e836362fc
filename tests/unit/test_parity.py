from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from monitoring.parity import compare_features


def test_exact_for_integers_and_strings_tolerant_for_floats():
    served = pd.DataFrame({"i": [1, 2, 3], "s": ["a", "b", "c"], "f": [1.0, 2.0, 1e-9]})
    offline = pd.DataFrame({"i": [1, 2, 4], "s": ["a", "B", "c"], "f": [1.0 + 5e-7, 2.0 * (1 + 2e-6), 1e-9]})
    result = compare_features(served, offline, ["i", "s", "f"])
    by_name = {f.feature: f for f in result.features}
    assert by_name["i"].mismatches == 1 and by_name["i"].first_mismatch_row == 2
    assert by_name["s"].mismatches == 1 and by_name["s"].first_mismatch_row == 1
    assert by_name["f"].mismatches == 1 and by_name["f"].first_mismatch_row == 1
    assert result.mismatched() == ["i", "s", "f"]


def test_missing_values_match_only_missing_values():
    served = pd.DataFrame({"f": [np.nan, 1.0, np.nan]})
    offline = pd.DataFrame({"f": [np.nan, np.nan, 0.0]})
    assert compare_features(served, offline, ["f"]).features[0].mismatches == 2


def test_misaligned_or_missing_columns_are_refused():
    with pytest.raises(ValueError, match="aligned"):
        compare_features(pd.DataFrame({"a": [1]}), pd.DataFrame({"a": [1, 2]}), ["a"])
    with pytest.raises(ValueError, match="b"):
        compare_features(pd.DataFrame({"a": [1]}), pd.DataFrame({"a": [1]}), ["a", "b"])
