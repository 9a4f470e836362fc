"""The batch benchmark's verdicts: features given against mlflow models predict (5x) and against the limit
(within 2x of its seconds), read from rows as the runs report them."""

from __future__ import annotations

from benchmarks.batch_report import FEATURES_GIVEN, LIMIT, MLFLOW, verdicts


def row(tool: str, rows: int, wall_s: float, work_s: float) -> dict:
    return {
        "tool": tool,
        "rows": rows,
        "wall_s": wall_s,
        "rows_per_s": round(rows / wall_s),
        "work_s": work_s,
        "work_rows_per_s": round(rows / work_s),
        "peak_rss_mb": 1000,
    }


def test_features_given_is_scored_against_mlflow_and_against_the_limit_at_the_same_size():
    results = [
        row(FEATURES_GIVEN, 10_000_000, 40.0, 30.0),
        row(LIMIT, 10_000_000, 20.0, 14.0),
        row(MLFLOW, 10_000_000, 220.0, 210.0),
        row(LIMIT, 1_000_000, 3.0, 2.0),
    ]
    by_target = {v["target"]: v for v in verdicts(results)}
    assert by_target[f"{FEATURES_GIVEN} rows_per_s vs {MLFLOW} (10000000 rows)"]["ratio"] == 5.5
    assert by_target[f"{FEATURES_GIVEN} rows_per_s vs {MLFLOW} (10000000 rows)"]["pass"] is True
    assert by_target[f"{FEATURES_GIVEN} work_rows_per_s vs {MLFLOW} (10000000 rows)"]["ratio"] == 7.0
    over = by_target[f"{FEATURES_GIVEN} work s over the {LIMIT}"]
    assert over["ratio"] == 2.14 and over["pass"] is False and over["rows"] == 10_000_000
    faster = verdicts([row(FEATURES_GIVEN, 10_000_000, 30.0, 20.0), row(LIMIT, 10_000_000, 20.0, 14.0)])
    assert [v["pass"] for v in faster] == [True]
