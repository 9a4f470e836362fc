"""The canary's steps, pure: a state, a verdict's decision and a clock in, the next action out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from serving.registry.canary_steps import (
    ACTIVE,
    ADVANCE,
    HOLD,
    PROMOTE,
    ROLLBACK,
    CanaryPlan,
    CanaryState,
    drained,
    next_action,
    with_memory,
)

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _state(traffic: int = 5, started: datetime = NOW - timedelta(minutes=15)) -> CanaryState:
    return CanaryState(
        endpoint="e",
        model="m",
        champion_entity="champ",
        champion_version="1",
        challenger_entity="chall",
        challenger_version="2",
        status=ACTIVE,
        traffic=traffic,
        step_started=started.isoformat(),
        started=started.isoformat(),
    )


def test_steps_advance_after_the_dwell_and_promote_at_100():
    plan = CanaryPlan(min_dwell_s=600)
    assert next_action(plan, _state(5), "ok", "fine", NOW) == next_action(plan, _state(5), "ok", "fine", NOW)
    assert next_action(plan, _state(5), "ok", "fine", NOW).kind == ADVANCE
    assert next_action(plan, _state(5), "ok", "fine", NOW).traffic == 25
    assert next_action(plan, _state(25), "ok", "fine", NOW).traffic == 50
    final = next_action(plan, _state(50), "ok", "fine", NOW)
    assert (final.kind, final.traffic) == (PROMOTE, 100)
    early = next_action(plan, _state(5, started=NOW - timedelta(minutes=2)), "ok", "fine", NOW)
    assert early.kind == HOLD and "dwell" in early.reason


def test_a_rollback_verdict_acts_at_once_and_anything_unclear_holds():
    plan = CanaryPlan(min_dwell_s=600)
    fresh = _state(25, started=NOW - timedelta(seconds=5))
    assert next_action(plan, fresh, "rollback", "p99", NOW).kind == ROLLBACK
    assert next_action(plan, fresh, "rollback", "p99", NOW).traffic == 0
    for decision in ("warn", "insufficient"):
        assert next_action(plan, fresh, decision, "why", NOW).kind == HOLD


def test_a_warning_holds_a_step_for_a_bounded_time_and_not_enough_data_holds_without_one():
    plan = CanaryPlan(min_dwell_s=600, max_warn_hold_s=1800)
    warned = next_action(plan, _state(5, started=NOW - timedelta(minutes=20)), "warn", "p50 +21%", NOW)
    assert warned.kind == HOLD and warned.traffic == 5 and "p50 +21%" in warned.reason
    on = next_action(plan, _state(5, started=NOW - timedelta(minutes=31)), "warn", "p50 +21%", NOW)
    assert (on.kind, on.traffic) == (ADVANCE, 25) and "not a rollback" in on.reason and "p50 +21%" in on.reason
    last = next_action(plan, _state(50, started=NOW - timedelta(minutes=31)), "warn", "p99 +30%", NOW)
    assert (last.kind, last.traffic) == (PROMOTE, 100)
    waiting = next_action(plan, _state(5, started=NOW - timedelta(days=2)), "insufficient", "not enough data yet", NOW)
    assert waiting.kind == HOLD
    short = CanaryPlan(min_dwell_s=600, max_warn_hold_s=0)  # the dwell still applies to a warned step
    assert next_action(short, _state(5, started=NOW - timedelta(minutes=5)), "warn", "w", NOW).kind == HOLD


def test_plan_validation_state_round_trip_drain_and_memory_cap():
    with pytest.raises(ValueError, match="end at 100"):
        CanaryPlan(steps=(5, 50))
    with pytest.raises(ValueError):
        CanaryPlan(steps=(50, 25, 100))
    state = _state().moved(NOW, status="rolled_back", traffic=0, ended=NOW.isoformat())
    assert CanaryState.from_dict(state.to_dict()) == state and state.history[-1]["status"] == "rolled_back"
    plan = CanaryPlan(drain_s=60, max_memory_samples=3)
    assert not drained(plan, state, NOW + timedelta(seconds=30)) and drained(plan, state, NOW + timedelta(seconds=61))
    capped = with_memory(plan, state, [{"timestamp": str(i), "served_entity": "chall", "rss_mb": i} for i in range(5)])
    assert [m["rss_mb"] for m in capped.memory] == [2, 3, 4]


def test_the_shadow_phase_holds_its_own_dwell_then_moves_to_the_first_step():
    from dataclasses import replace

    plan = CanaryPlan(min_dwell_s=60, shadow_percent=50, shadow_dwell_s=1200)
    shadow = replace(_state(0, started=NOW - timedelta(minutes=15)), phase="shadow")
    held = next_action(plan, shadow, "ok", "fine", NOW)
    assert held.kind == HOLD and "1200 s dwell in the shadow phase" in held.reason
    later = replace(shadow, step_started=(NOW - timedelta(minutes=25)).isoformat())
    moved = next_action(plan, later, "ok", "fine", NOW)
    assert (moved.kind, moved.traffic) == (ADVANCE, 5)
    assert next_action(plan, later, "rollback", "agreement", NOW).kind == ROLLBACK
    with pytest.raises(ValueError, match="shadow_percent"):
        CanaryPlan(shadow_percent=101)
