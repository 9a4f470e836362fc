"""tollfree extension of an endpoint's config: ``monitoring``, the settings its monitoring flows read.

``enabled: false`` opts the endpoint out of the scheduled drift and canary flows. ``drift`` and
``canary`` override the flows' thresholds (``DriftConfig`` and ``CanaryThresholds`` below: an unknown name or a mistyped
value is a 400 naming it). ``window_hours`` and ``min_rows`` bound what one drift run reads. ``reference``
says what drift compares with when a version has no training frame on its run: a dataset logged on
the version's run with ``mlflow.log_input`` (``dataset``: its name), a window of the version's own
served traffic (``start`` and ``end``), or by default its first served window (its first
``first_requests`` requests within ``first_hours`` of its first one). A config update that leaves the
block out keeps it (the Databricks SDK's ``update_config`` cannot send it; ``validation.keep_extensions``);
``"monitoring": null`` removes it.

``DriftConfig`` and ``CanaryThresholds`` are the settings the computations in ``monitoring/`` take (plain
dataclasses, no heavy import): the gateway checks a ``monitoring`` block against them when the endpoint
is configured, and the flows build them when they run. ``overridden`` gives the defaults with a mapping's
values; an unknown name or a value of the wrong type is refused by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from serving.protocol.errors import invalid_parameter

_FORBID = ConfigDict(extra="forbid")
if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")  # the settings dataclasses


CORRECTIONS = ("holm", "bonferroni", "none")
# Evidently's methods whose score is a p-value (drift below the threshold), and ``chi2_contingency``
# (monitoring/drift.py)
P_VALUE_METHODS = frozenset(
    {
        "ks",
        "chisquare",
        "z",
        "t_test",
        "mannw",
        "anderson",
        "cramer_von_mises",
        "fisher_exact",
        "epps_singleton",
        "g_test",
        "chi2_contingency",
    }
)
MAX_P_VALUE_THRESHOLD = 0.1  # above it, a threshold given for a p-value method is taken for a distance and refused


@dataclass(frozen=True)
class DriftConfig:
    """How a drift run judges a version (``monitoring/drift.py``). With a p-value method (the defaults) a
    threshold bounds the share of runs on clean traffic that name a column: the columns' p-values are
    corrected together (``correction``), whatever the number of columns and rows. A distance method (``psi``,
    ``wasserstein``, ``jensenshannon``) is compared with its threshold as it is, uncorrected; its false-alarm
    rate grows as windows shrink and columns add up. The run drifts (a finding, the flow fails) when at least
    one column drifts and at least ``drift_share`` of the columns do."""

    numeric_method: str = "ks"  # two-sample Kolmogorov-Smirnov
    numeric_threshold: float = 0.005
    categorical_method: str = "chi2_contingency"  # two-sample chi-square test of homogeneity
    categorical_threshold: float = 0.005
    correction: str = "holm"  # across the columns scored by p-value methods: holm, bonferroni or none
    drift_share: float = 0.0  # 0: any drifted column is drift; 0.5: half of the columns must drift

    def __post_init__(self) -> None:
        if self.correction not in CORRECTIONS:
            raise ValueError(f"drift setting correction must be one of {', '.join(CORRECTIONS)}")
        if not 0.0 <= self.drift_share <= 1.0:
            raise ValueError("drift setting drift_share must be between 0 and 1")
        for kind in ("numeric", "categorical"):
            method, threshold = getattr(self, f"{kind}_method"), getattr(self, f"{kind}_threshold")
            if method in P_VALUE_METHODS and not 0.0 < threshold <= MAX_P_VALUE_THRESHOLD:
                raise ValueError(
                    f"drift setting {kind}_threshold {threshold} is the false-alarm rate of {method} (a p-value "
                    f"method): between 0 and {MAX_P_VALUE_THRESHOLD}; for a distance set {kind}_method too, "
                    "e.g. psi"
                )


@dataclass(frozen=True)
class CanaryThresholds:
    p99_warn: float = 0.20  # relative increase of the challenger's p99 over the champion's
    p99_rollback: float = 0.50
    p50_warn: float = 0.20  # p50 only warns (holds); Databricks' guidance sets no p50 rollback
    error_warn: float = 0.001  # absolute error rate of the challenger
    error_rollback: float = 0.005
    accuracy_warn: float = 0.02  # relative drop of accuracy against the champion's
    accuracy_rollback: float = 0.05
    memory_growth: float = 0.10  # relative RSS growth over the window that counts as rising
    min_requests: int = 200  # per side, for latency and for an error rate to be called fine
    min_error_requests: int = 20  # below this even a blatant error rate waits
    min_labelled: int = 200  # per side, for accuracy
    min_memory_samples: int = 6
    require_labels: bool = False  # hold until accuracy can be judged
    # the shadow phase: the share of requests whose two answers agree (every prediction equal; numbers within
    # agreement_tolerance), below which it warns or rolls back (monitoring.shadow)
    agreement_tolerance: float = 0.1
    agreement_warn: float = 0.90
    agreement_rollback: float = 0.70
    alpha: float = 0.05
    bootstrap: int = 1000
    max_bootstrap_rows: int = 5000
    seed: int = 0

    @classmethod
    def from_mapping(cls, values: dict[str, Any] | None) -> CanaryThresholds:
        return overridden(cls, values, "canary threshold")


_KINDS = {bool: "true or false", int: "an integer", float: "a finite number"}


def _fits(default: Any, value: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, type(default))


def overridden(cls: type[T], values: dict[str, Any] | None, what: str) -> T:
    """``cls()`` with ``values`` overriding its defaults; an unknown name or a mistyped value is refused by name."""
    values = dict(values or {})
    defaults = cls()
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(f"unknown {what}(s): {', '.join(unknown)}")
    for name, value in values.items():
        default = getattr(defaults, name)
        if not _fits(default, value):
            raise ValueError(f"{what} {name} must be {_KINDS.get(type(default), 'a string')}")
    return replace(defaults, **values)


class ReferenceConfig(BaseModel):
    model_config = _FORBID
    dataset: str | None = Field(default=None, min_length=1, max_length=256)
    start: datetime | None = None
    end: datetime | None = None
    first_requests: StrictInt = Field(default=1000, ge=10, le=1_000_000)
    first_hours: float = Field(default=1.0, gt=0, le=24 * 30)


class MonitoringConfig(BaseModel):
    model_config = _FORBID
    enabled: StrictBool = True
    window_hours: float = Field(default=24.0, gt=0, le=24 * 90)
    min_rows: StrictInt = Field(default=50, ge=1, le=10_000_000)
    drift: dict[str, Any] = Field(default_factory=dict, max_length=20)
    canary: dict[str, Any] = Field(default_factory=dict, max_length=40)
    reference: ReferenceConfig = Field(default_factory=ReferenceConfig)


def check_monitoring(config: MonitoringConfig) -> None:
    """What the field types cannot say: the threshold names and types, and one reference kind at a time."""
    for key, cls, what in (("drift", DriftConfig, "drift setting"), ("canary", CanaryThresholds, "canary threshold")):
        try:
            overridden(cls, getattr(config, key), what)
        except ValueError as exc:
            raise invalid_parameter(f"monitoring.{key}: {exc}") from None
    ref = config.reference
    if (ref.start is None) != (ref.end is None):
        raise invalid_parameter("monitoring.reference: set both start and end, or neither")
    if ref.start is not None and ref.end is not None:
        if ref.start.tzinfo is None or ref.end.tzinfo is None:
            raise invalid_parameter("monitoring.reference: start and end need a time zone (for example 'Z')")
        if ref.start >= ref.end:
            raise invalid_parameter("monitoring.reference: start must be before end")
        if ref.dataset is not None:
            raise invalid_parameter("monitoring.reference: set a dataset or a start/end window, not both")
