"""Promotion gates: pure functions from a policy section and measured evidence to a verdict.

Each returns pass/fail with the measured value, the threshold and a one-line reason, so that the
result can be written as tags on the model version and read in the Prefect UI.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol


@dataclass(frozen=True)
class GateResult:
    gate: str
    passed: bool
    value: str
    threshold: str
    reason: str

    def as_row(self) -> dict[str, Any]:
        return {**asdict(self), "passed": "PASS" if self.passed else "FAIL"}


@dataclass(frozen=True)
class ProbeFigures:
    """What serving the candidate in a real replica measured."""

    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    peak_rss_mb: float
    cpu_ms_per_prediction: float
    artifact_mb: float


class GroupGap(Protocol):
    """What the fairness gate reads (``monitoring.fairness.group_rates`` measures it): the rate per group
    (each with ``group``, ``rate`` and ``rows``), the largest gap, and the groups at its two ends (None
    when fewer than two groups have enough rows). Read-only, so a frozen dataclass satisfies it."""

    @property
    def rate(self) -> str: ...
    @property
    def groups(self) -> Sequence[Any]: ...
    @property
    def gap(self) -> float: ...
    @property
    def worst(self) -> tuple[str, str] | None: ...


def _fmt(values: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in values.items())


def quality_gate(
    cfg: Mapping[str, Any], candidate: Mapping[str, float], champion: Mapping[str, float] | None
) -> GateResult:
    """Metrics above absolute minimums, and not worse than the champion's by more than the tolerance."""
    minimums: Mapping[str, float] = cfg["min"]
    missing = [m for m in minimums if m not in candidate]
    if missing:
        return GateResult("quality", False, "n/a", _fmt(minimums), f"candidate has no metric(s) {', '.join(missing)}")
    low = [m for m, floor in minimums.items() if candidate[m] < floor]
    measured = {m: candidate[m] for m in minimums}
    if low:
        return GateResult(
            "quality",
            False,
            _fmt(measured),
            _fmt(minimums),
            f"below minimum: {', '.join(f'{m} {candidate[m]:.4f} < {minimums[m]}' for m in low)}",
        )
    vs = cfg.get("vs_champion")
    if vs and champion is not None:
        metric, max_drop = vs["metric"], float(vs["max_drop"])
        drop = champion[metric] - candidate[metric]
        value = f"{metric} candidate={candidate[metric]:.4f} champion={champion[metric]:.4f}"
        if drop > max_drop:
            return GateResult(
                "quality",
                False,
                value,
                f"drop <= {max_drop}",
                f"{metric} is {drop:.4f} worse than the champion's on the same rows (tolerance {max_drop})",
            )
        return GateResult(
            "quality",
            True,
            value,
            f"{_fmt(minimums)}; drop <= {max_drop}",
            f"above minimums and within {max_drop} of the champion",
        )
    return GateResult("quality", True, _fmt(measured), _fmt(minimums), "above minimums (no champion to compare)")


def latency_gate(cfg: Mapping[str, Any], probe: ProbeFigures) -> GateResult:
    """p50 and p99 of the candidate served in a real replica, within budget, with no errors."""
    value = f"p50={probe.p50_ms:.2f}ms p99={probe.p99_ms:.2f}ms errors={probe.errors}/{probe.requests}"
    threshold = f"p50<={cfg['p50_ms']}ms p99<={cfg['p99_ms']}ms"
    if probe.errors:
        return GateResult("latency", False, value, threshold, f"{probe.errors} of {probe.requests} requests failed")
    slow = [
        f"{name} {got:.2f}ms > {limit}ms"
        for name, got, limit in (("p50", probe.p50_ms, cfg["p50_ms"]), ("p99", probe.p99_ms, cfg["p99_ms"]))
        if got > float(limit)
    ]
    if slow:
        return GateResult("latency", False, value, threshold, "over budget: " + ", ".join(slow))
    return GateResult("latency", True, value, threshold, "within the latency budget")


def fairness_gate(cfg: Mapping[str, Any], result: GroupGap) -> GateResult:
    """The gap of a rate between groups of the sensitive attribute below a bound."""
    rates = ", ".join(f"{g.group}={g.rate:.4f}(n={g.rows})" for g in result.groups)
    threshold = f"{result.rate} gap <= {cfg['max_gap']}"
    if result.worst is None:
        return GateResult("fairness", False, rates, threshold, "fewer than two groups with enough rows to compare")
    if result.gap > float(cfg["max_gap"]):
        low, high = result.worst
        return GateResult(
            "fairness",
            False,
            f"gap={result.gap:.4f}; {rates}",
            threshold,
            f"{result.rate} differs by {result.gap:.4f} between {cfg['attribute']} {low} and {high}",
        )
    return GateResult("fairness", True, f"gap={result.gap:.4f}; {rates}", threshold, "gap within bound")


def cost_gate(cfg: Mapping[str, Any], probe: ProbeFigures) -> GateResult:
    """Artifact size, peak memory of a loaded replica and CPU time per prediction under bounds."""
    measured = {
        "artifact_mb": probe.artifact_mb,
        "peak_rss_mb": probe.peak_rss_mb,
        "cpu_ms_per_prediction": probe.cpu_ms_per_prediction,
    }
    limits = {k: float(cfg[k]) for k in measured}
    over = [f"{k} {measured[k]:.3g} > {limits[k]:g}" for k in measured if measured[k] > limits[k]]
    if over:
        return GateResult("cost", False, _fmt(measured), _fmt(limits), "over bound: " + ", ".join(over))
    return GateResult("cost", True, _fmt(measured), _fmt(limits), "within cost bounds")


SERVING_GATES = {"latency": latency_gate, "cost": cost_gate}
DEFAULT_PROBES = 2


def serving_gates(cfgs: Mapping[str, Mapping[str, Any]], measure: Callable[[], ProbeFigures]) -> dict[str, GateResult]:
    """The latency and cost gates (those of ``cfgs`` present) on a candidate served and measured by ``measure``.

    One probe is 150 requests or so, and its p99 lies between its second- and third-slowest answers:
    one pause of a busy machine that holds up the requests in flight fails it. So a probe whose
    figures fail either gate is measured again in a fresh replica, up to ``probes`` times in all
    (the latency section's, else the cost section's; default 2), and the gates are judged on the
    first probe that passes both, or on the last. A candidate that is really slow or costly fails
    every probe; the earlier probes' figures are kept in the value.
    """
    names = [name for name in SERVING_GATES if name in cfgs]
    if not names:
        return {}
    attempts = int(next(cfgs[name].get("probes", DEFAULT_PROBES) for name in names))
    earlier: list[dict[str, GateResult]] = []
    while True:
        probe = measure()
        results = {name: SERVING_GATES[name](cfgs[name], probe) for name in names}
        if all(r.passed for r in results.values()) or len(earlier) + 1 >= attempts:
            break
        earlier.append(results)
    if not earlier:
        return results
    return {
        name: replace(
            result,
            value=f"{result.value} (probe {len(earlier) + 1} of {attempts}; earlier: "
            + "; ".join(e[name].value for e in earlier)
            + ")",
        )
        for name, result in results.items()
    }


def data_gate(cfg: Mapping[str, Any], tags: Mapping[str, str]) -> GateResult:
    """The training data passed its Great Expectations suite in the train flow."""
    if "gx.success" not in tags:
        return GateResult(
            "data", False, "not validated", "gx.success=true", "the training data has no validation result"
        )
    ok = tags["gx.success"] == "true"
    passed, evaluated = tags.get("gx.successful", "?"), tags.get("gx.evaluated", "?")
    value = f"suite {tags.get('gx.suite', '?')}: {passed}/{evaluated} expectations"
    if not ok and cfg.get("require_success", True):
        return GateResult("data", False, value, "gx.success=true", f"failed: {tags.get('gx.failed', 'see the run')}")
    return GateResult("data", True, value, "gx.success=true", "training data passed its suite")


def compatibility_gate(
    cfg: Mapping[str, Any],
    *,
    input_names: Sequence[str] | None,
    feature_service: str | None,
    expected_service: str | None,
    service_features: Sequence[str] | None,
) -> GateResult:
    """The signature and FeatureService fit the endpoint the candidate is meant for."""
    if input_names is None:
        return GateResult("compatibility", False, "no signature", "a signature", "the model has no input signature")
    threshold = f"feature_service={expected_service}"
    if expected_service and feature_service != expected_service:
        return GateResult(
            "compatibility",
            False,
            f"feature_service={feature_service}",
            threshold,
            f"the endpoint serves {expected_service}, the model was trained on {feature_service}",
        )
    if service_features is not None and list(input_names) != list(service_features):
        extra = sorted(set(input_names) - set(service_features))
        lacking = sorted(set(service_features) - set(input_names))
        return GateResult(
            "compatibility",
            False,
            f"inputs={len(input_names)}",
            f"{threshold} inputs",
            f"signature differs from the service's features (extra {extra[:5]}, missing {lacking[:5]})",
        )
    return GateResult(
        "compatibility", True, f"feature_service={feature_service}", threshold, "signature matches the FeatureService"
    )
