"""An entity scaler's state as a plain record, and back: so another process can continue where it stopped.

The record holds the policy state (replicas, learned target, stress flags, when each axis last acted) and
the recent samples (the windows the policy reads). Times move by ``shift`` seconds each way: the live
autoscaler runs on the monotonic clock, records carry seconds since the epoch (another process, maybe on
another machine, has another monotonic clock). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from typing import Any

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.policy import PolicyState
from serving.autoscaler.signals import Sample

_STATE_TIMES = ("started_at", "last_horizontal", "last_vertical", "last_busy")


def _moved(value: float | None, shift: float) -> float | None:
    return None if value is None else value + shift


def to_record(state: PolicyState, samples: tuple[Sample, ...], shift: float) -> dict[str, Any]:
    """``state`` and ``samples`` with every time moved by ``shift``, as JSON-ready values."""
    moved_state = {k: (_moved(v, shift) if k in _STATE_TIMES else v) for k, v in asdict(state).items()}
    moved_samples = [dict(asdict(s), t=s.t + shift) for s in samples]
    return {"policy": moved_state, "samples": moved_samples}


def from_record(record: Mapping[str, Any], config: ScalingConfig, shift: float) -> tuple[PolicyState, list[Sample]]:
    """The policy state and samples of a record, times moved by ``shift`` and the target kept inside the
    config's bounds; KeyError or TypeError if the record is not one of ``to_record``'s."""
    names = {f.name for f in fields(PolicyState)}
    values = {k: v for k, v in record["policy"].items() if k in names}
    moved: dict[str, Any] = {k: (_moved(v, shift) if k in _STATE_TIMES else v) for k, v in values.items()}
    state = PolicyState(**moved)
    state = replace(state, target=min(config.max_target, max(config.min_target, state.target)))
    sample_names = {f.name for f in fields(Sample)}
    samples = []
    for raw in record["samples"]:
        values = {k: v for k, v in raw.items() if k in sample_names}
        values["t"] = raw["t"] + shift
        samples.append(Sample(**values))
    return state, samples
