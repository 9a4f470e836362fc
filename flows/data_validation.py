"""Great Expectations checks on the training frame, summarised for MLflow tags and Prefect artifacts.

The suite is a plain list of GX 1.x expectation objects built from the feature names; validation runs
in an ephemeral context with progress bars off. Results are matched to the suite by (expectation type,
column), never by position: GX does not return results in suite order. Outcomes carry counts and
percentages only, never row values. ``great_expectations`` is imported lazily (it takes seconds).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from feature_repo.synthetic import AGE_GROUPS

if TYPE_CHECKING:
    import pandas as pd
    from great_expectations.expectations.expectation import Expectation

log = logging.getLogger(__name__)

KEY_COLUMNS: tuple[str, ...] = ("transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount")
ROW_KEY = "transaction_id"
AMOUNT = "amount"
SENSITIVE_ATTRIBUTE = "age_group"
LABEL_MEAN_RANGE = (0.001, 0.5)
TAG_LIMIT = 500


@dataclass(frozen=True)
class ExpectationOutcome:
    expectation: str  # GX type name, e.g. "expect_column_values_to_not_be_null"
    column: str | None
    success: bool
    observed: str  # a count, percent or aggregate; never row values

    @property
    def label(self) -> str:
        return f"{self.expectation}({self.column})" if self.column else self.expectation


@dataclass(frozen=True)
class ValidationSummary:
    suite: str
    success: bool
    evaluated: int
    successful: int
    rows: int
    outcomes: tuple[ExpectationOutcome, ...]
    seconds: float

    def failed(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def as_tags(self) -> dict[str, str]:
        """String tags for an MLflow run; the promotion gate reads ``gx.success``."""
        tags = {
            "gx.suite": self.suite,
            "gx.success": "true" if self.success else "false",
            "gx.evaluated": str(self.evaluated),
            "gx.successful": str(self.successful),
            "gx.rows": str(self.rows),
            "gx.failed": ", ".join(o.label for o in self.failed()),
        }
        return {k: _clip(v, TAG_LIMIT) for k, v in tags.items()}

    def table(self) -> list[dict[str, Any]]:
        """Rows for a Prefect table artifact, in suite order."""
        return [
            {"expectation": o.expectation, "column": o.column or "", "success": o.success, "observed": o.observed}
            for o in self.outcomes
        ]


def training_suite(
    feature_names: list[str], label: str = "is_fraud", min_rows: int = 1000, *, with_age_group: bool = True
) -> list[Expectation]:
    """The fraud training-set expectations, one per (type, column)."""
    import great_expectations as gx

    ex = gx.expectations
    not_null = list(dict.fromkeys([*KEY_COLUMNS, *feature_names, label]))
    counts = [f for f in feature_names if "_count_" in f]
    rates = [f for f in feature_names if "_rate_" in f]
    suite: list[Expectation] = [
        ex.ExpectTableRowCountToBeBetween(min_value=min_rows),
        ex.ExpectColumnValuesToBeInSet(column=label, value_set=[0, 1]),
        ex.ExpectColumnMeanToBeBetween(column=label, min_value=LABEL_MEAN_RANGE[0], max_value=LABEL_MEAN_RANGE[1]),
        *(ex.ExpectColumnValuesToNotBeNull(column=c) for c in not_null),
        ex.ExpectColumnValuesToBeBetween(column=AMOUNT, min_value=0, strict_min=True),
        *(ex.ExpectColumnValuesToBeBetween(column=c, min_value=0) for c in counts),
        *(ex.ExpectColumnValuesToBeBetween(column=c, min_value=0, max_value=1) for c in rates),
        ex.ExpectColumnValuesToBeUnique(column=ROW_KEY),
    ]
    if with_age_group:
        suite.append(ex.ExpectColumnValuesToBeInSet(column=SENSITIVE_ATTRIBUTE, value_set=list(AGE_GROUPS)))
    return list({_key(e.expectation_type, getattr(e, "column", None)): e for e in suite}.values())


def validate_frame(
    frame: pd.DataFrame,
    feature_names: list[str],
    *,
    suite_name: str = "fraud-training",
    label: str = "is_fraud",
    min_rows: int = 1000,
) -> ValidationSummary:
    """Validate the whole frame against ``training_suite``; missing columns become failed outcomes."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    started = time.perf_counter()
    expectations = training_suite(feature_names, label, min_rows, with_age_group=SENSITIVE_ATTRIBUTE in frame.columns)
    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    batch = (
        context.data_sources.add_pandas(name="training")
        .add_dataframe_asset(name="frame")
        .add_batch_definition_whole_dataframe(name="whole")
        .get_batch(batch_parameters={"dataframe": frame})
    )
    result = batch.validate(gx.ExpectationSuite(name=suite_name, expectations=expectations), result_format="BASIC")
    by_key = {_key(r.expectation_config.type, r.expectation_config.kwargs.get("column")): r for r in result.results}

    outcomes = []
    for e in expectations:
        column = getattr(e, "column", None)
        found = by_key.get(_key(e.expectation_type, column))
        if column is not None and column not in frame.columns:
            outcomes.append(ExpectationOutcome(e.expectation_type, column, False, "column missing"))
        elif found is None:
            outcomes.append(ExpectationOutcome(e.expectation_type, column, False, "no result"))
        else:
            outcomes.append(ExpectationOutcome(e.expectation_type, column, bool(found.success), _observed(found)))
    ok = sum(o.success for o in outcomes)
    summary = ValidationSummary(
        suite=suite_name,
        success=bool(result.success) and ok == len(outcomes),
        evaluated=len(outcomes),
        successful=ok,
        rows=len(frame),
        outcomes=tuple(outcomes),
        seconds=time.perf_counter() - started,
    )
    log.info(
        "suite %s on %d rows: %d/%d expectations met in %.3f s%s",
        suite_name,
        summary.rows,
        ok,
        summary.evaluated,
        summary.seconds,
        "" if summary.success else f"; failed: {summary.as_tags()['gx.failed']}",
    )
    return summary


def _key(expectation: str, column: str | None) -> tuple[str, str | None]:
    return expectation, column


def _observed(found: Any) -> str:
    """A short, value-free description of one GX result."""
    info = found.exception_info or {}
    infos = info.values() if "raised_exception" not in info else [info]
    errors = [i.get("exception_message") for i in infos if isinstance(i, dict) and i.get("raised_exception")]
    if errors:
        log.warning("%s raised: %s", found.expectation_config.type, errors[0])
        return "error"
    res = found.result or {}
    if "unexpected_count" in res:
        pct = res.get("unexpected_percent")
        share = f" ({pct:.3g}%)" if isinstance(pct, (int, float)) else ""
        return f"{res['unexpected_count']} of {res.get('element_count', '?')} unexpected{share}"
    value = res.get("observed_value")
    if isinstance(value, float):
        return f"observed {value:.4g}"
    if isinstance(value, int):
        return f"observed {value}"
    return "n/a"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
