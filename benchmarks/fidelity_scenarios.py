"""The fidelity benchmark's scenarios: a load shape, a warm-pool size, the vertical axis and load shedding.

The rates and the endpoint's scale-down window are the live autoscaler test's (tests/e2e/test_autoscaler_live.py),
so that a scenario's live run is that test's set-up with one setting changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from serving.settings import TELEMETRY_OFF

os.environ.update({k: v for k, v in TELEMETRY_OFF.items() if k not in os.environ})  # before MLflow is imported

from tests.e2e.test_autoscaler_live import BASE_RPS, SCALE_DOWN_WINDOW_S, STEP_RPS

NAME = "fidelity"  # the endpoint's name
BASE_S = 8.0  # every shape starts with BASE_RPS for this long; its step comes then
SLO_MS = 500.0  # the endpoint's latency_slo_ms (ScalingConfig's default), for both sides
MAX_REPLICAS = 4
SHAPES = ("step", "ramp", "bursty")


def load_phases(shape: str) -> list[tuple[float, float]]:
    """The shape's load as (rate req/s, seconds) phases: BASE_RPS for BASE_S, then a 10x step held 20 s; a ramp to it in
    ten 2-s phases, held 8 s; or two 5-s bursts at it, each followed by 7 s at the base rate."""
    base, peak = float(BASE_RPS), float(STEP_RPS)
    after = {
        "step": [(peak, 20.0)],
        "bursty": [(peak, 5.0), (base, 7.0)] * 2,
        "ramp": [(base + (peak - base) * (k + 1) / 10, 2.0) for k in range(10)] + [(peak, 8.0)],
    }
    if shape not in after:
        raise ValueError(f"unknown load shape {shape!r} (one of {', '.join(SHAPES)})")
    return [(base, BASE_S)] + after[shape]


@dataclass(frozen=True)
class Scenario:
    """One live run and its replay: a load shape, the warm-pool size, the vertical axis and load shedding."""

    name: str
    shape: str
    pool: int
    vertical: bool
    shed: bool

    # every shape's step: the phase after the base one, at BASE_S; time to capacity is against the peak rate
    step_index, step_at, step_rate = 1, BASE_S, float(STEP_RPS)

    @property
    def phases(self) -> list[tuple[float, float]]:
        return load_phases(self.shape)

    @property
    def autoscaling(self) -> dict[str, Any]:
        """The endpoint's autoscaling block, the simulated policy's too. The vertical axis on, no ``initial_target``:
        the gateway seeds it from the model's batching plan, as ``Tollfree(profile=...)`` does."""
        block: dict[str, Any] = {
            "scale_down_window_s": SCALE_DOWN_WINDOW_S,
            "initial_target": 1,
            "vertical": self.vertical,
            "shed_load": self.shed,
        }
        if self.vertical:
            del block["initial_target"]
        return block

    @property
    def settings(self) -> str:
        flag = ("off", "on")
        return f"{self.shape}, warm pool {self.pool}, vertical {flag[self.vertical]}, shed {flag[self.shed]}"


SCENARIOS = (
    Scenario("step-pool3", "step", 3, vertical=False, shed=False),  # the live autoscaler test's setting
    Scenario("step-pool1", "step", 1, vertical=False, shed=False),
    Scenario("step-pool1-vertical", "step", 1, vertical=True, shed=False),
    Scenario("step-pool1-vertical-shed", "step", 1, vertical=True, shed=True),
    Scenario("ramp-pool1-vertical", "ramp", 1, vertical=True, shed=False),
    Scenario("ramp-pool3-shed", "ramp", 3, vertical=False, shed=True),
    Scenario("bursty-pool1-vertical-shed", "bursty", 1, vertical=True, shed=True),
    Scenario("bursty-pool3-vertical", "bursty", 3, vertical=True, shed=False),
)
BY_NAME = {s.name: s for s in SCENARIOS}


def listing() -> str:
    """Each scenario's name, settings and load phases, a line each (``--list``)."""
    return "\n".join(
        f"{s.name:<28}{s.settings}; phases (req/s, s) "
        + ", ".join(f"({rate:g}, {seconds:g})" for rate, seconds in s.phases)
        for s in SCENARIOS
    )
