"""The canary's progress as a value: where it stands, and what a verdict makes of it.

Pure: ``next_action(plan, state, decision, reason, now)`` returns what to do; ``canary.run_once`` does it and
stores the new state. Traffic goes 5 -> 25 -> 50 -> 100 % by default, each step held for at least
``min_dwell_s`` with a clean verdict before the next; reaching 100 % promotes the challenger; a
rollback verdict acts at once, whatever the dwell.

A warning (a threshold crossed short of a rollback) holds a step longer, up to ``max_warn_hold_s`` from
its start, and then lets it move on, with the warning in the reason: a warning is not a rollback, and a
challenger with a small share is measured slower than a busy champion even when the two are the same
model (an idle replica's caches are cold: +21 % p50 for an identical copy at 5 %, measured on a 2-core
machine), so an unbounded hold on a latency warning would keep a good canary at its first step forever.
Not enough data yet holds without a bound.

With ``shadow_percent``, the canary begins with a shadow phase: the challenger takes no traffic and is sent a copy
of that share of the requests after each client's answer (``serving.gateway.shadow``); its verdict compares the two
answers to the same requests (``monitoring.shadow``). A clean shadow held ``shadow_dwell_s`` moves to the first
step's traffic; a warning holds it as a warning holds a step; a rollback verdict ends the canary at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

ACTIVE, ROLLED_BACK, PROMOTED, FAILED = "active", "rolled_back", "promoted", "failed"
ADVANCE, HOLD, ROLLBACK, PROMOTE = "advance", "hold", "rollback", "promote"
SHADOW, CANARY = "shadow", "canary"  # a canary's phases: copies of requests only, then a share of the traffic


@dataclass(frozen=True)
class CanaryPlan:
    steps: tuple[int, ...] = (5, 25, 50, 100)
    min_dwell_s: float = 600.0  # at each step, with a clean verdict, before moving on
    drain_s: float = 60.0  # after traffic leaves an entity, before it is removed from the endpoint
    max_warn_hold_s: float = 1800.0  # how long from a step's start a warning holds it
    max_memory_samples: int = 200
    shadow_percent: int = 0  # > 0: a shadow phase at this share of the requests comes first
    shadow_dwell_s: float = 600.0  # the shadow phase, with a clean verdict, before the first step

    def __post_init__(self) -> None:
        steps = tuple(int(s) for s in self.steps)
        if not steps or steps[-1] != 100 or any(not 0 < s <= 100 for s in steps) or list(steps) != sorted(set(steps)):
            raise ValueError(f"canary steps must rise strictly within (0, 100] and end at 100, got {list(self.steps)}")
        if self.min_dwell_s < 0 or self.drain_s < 0 or self.max_warn_hold_s < 0 or self.shadow_dwell_s < 0:
            raise ValueError("min_dwell_s, drain_s, max_warn_hold_s and shadow_dwell_s must be >= 0")
        if not 0 <= self.shadow_percent <= 100:
            raise ValueError(f"shadow_percent must be between 0 (no shadow phase) and 100, got {self.shadow_percent}")
        object.__setattr__(self, "steps", steps)


@dataclass(frozen=True)
class CanaryState:
    endpoint: str
    model: str
    champion_entity: str
    champion_version: str
    challenger_entity: str
    challenger_version: str
    status: str  # active | rolled_back | promoted | failed
    traffic: int  # the challenger's share now
    step_started: str  # ISO time the current share took effect
    started: str
    ended: str | None = None
    cleaned: bool = False  # the losing entity has been removed from the endpoint
    last_decision: str | None = None
    last_reason: str | None = None
    history: tuple[dict[str, Any], ...] = ()
    memory: tuple[dict[str, Any], ...] = field(default=(), repr=False)  # {timestamp, served_entity, rss_mb}
    phase: str = CANARY  # shadow: the challenger is sent copies of requests and takes no traffic

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["history"], out["memory"] = list(self.history), list(self.memory)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CanaryState:
        data = dict(data)
        data["history"] = tuple(data.get("history") or ())
        data["memory"] = tuple(data.get("memory") or ())
        return cls(**data)

    def step_started_at(self) -> datetime:
        return datetime.fromisoformat(self.step_started)

    def moved(self, now: datetime, **changes: Any) -> CanaryState:
        """A copy with ``changes`` and an entry in the history."""
        entry = {
            "at": now.isoformat(),
            **{k: v for k, v in changes.items() if k in ("status", "traffic", "phase", "last_decision", "last_reason")},
        }
        return replace(self, **changes, history=(*self.history, entry))


@dataclass(frozen=True)
class Action:
    kind: str  # advance | hold | rollback | promote
    traffic: int  # the challenger's share after the action
    reason: str


def next_action(plan: CanaryPlan, state: CanaryState, decision: str, reason: str, now: datetime) -> Action:
    """What an active canary does with a verdict's ``decision`` (ok | warn | rollback | insufficient)."""
    if state.status != ACTIVE:
        raise ValueError(f"canary of {state.endpoint} is {state.status}, not active")
    if decision == "rollback":
        return Action(ROLLBACK, 0, reason)
    dwelt = (now - state.step_started_at()).total_seconds()
    where = "in the shadow phase" if state.phase == SHADOW else f"at {state.traffic} %"
    dwell_s = plan.shadow_dwell_s if state.phase == SHADOW else plan.min_dwell_s
    if decision == "warn":
        hold_s = max(dwell_s, plan.max_warn_hold_s)
        if dwelt < hold_s:
            return Action(
                HOLD, state.traffic, f"warning, held {dwelt:.0f} s of at most {hold_s:.0f} s {where}: {reason}"
            )
        return _next_step(plan, state, f"warned for {dwelt:.0f} s {where}, moving on (not a rollback): {reason}")
    if decision != "ok":
        return Action(HOLD, state.traffic, reason)
    if dwelt < dwell_s:
        return Action(HOLD, state.traffic, f"clean so far; {dwelt:.0f} s of the {dwell_s:.0f} s dwell {where}")
    return _next_step(plan, state, f"clean for {dwelt:.0f} s {where}: {reason}")


def _next_step(plan: CanaryPlan, state: CanaryState, reason: str) -> Action:
    if state.phase == SHADOW:  # the shadow phase ends at the first step's traffic
        first = plan.steps[0]
        return Action(PROMOTE if first == 100 else ADVANCE, first, reason)
    later = [s for s in plan.steps if s > state.traffic]
    target = later[0] if later else 100
    return Action(PROMOTE if target == 100 else ADVANCE, target, reason)


def drained(plan: CanaryPlan, state: CanaryState, now: datetime) -> bool:
    """Whether the losing entity has had no traffic for ``drain_s`` and may leave the endpoint."""
    if state.status == ACTIVE or state.cleaned or state.ended is None:
        return False
    return (now - datetime.fromisoformat(state.ended)).total_seconds() >= plan.drain_s


def with_memory(plan: CanaryPlan, state: CanaryState, samples: list[dict[str, Any]]) -> CanaryState:
    """The state with new memory samples appended, keeping the last ``max_memory_samples``."""
    kept = (*state.memory, *samples)[-plan.max_memory_samples :]
    return replace(state, memory=kept)
