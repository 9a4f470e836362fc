"""The console's pure parts: the timeline keeps an hour, the recorder takes each second's 5xx from the counters,
and an endpoint's row says what needs a look."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.autoscaler.signals import Sample, SampleHistory
from serving.console import views
from serving.console.recorder import TimelineRecorder
from serving.console.timeline import Point, Timeline


def _point(t: float, **changes) -> Point:  # type: ignore[no-untyped-def]
    base = {"desired": 2, "ready": 2, "provisioned": 2, "standby": 0, "requests": 10, "completed": 10, "errors": 0}
    base.update({"p50_ms": 5.0, "p99_ms": 20.0, "queue": 0.0, "in_flight": 1.0, "target": 4.0}, **changes)
    return Point(t=t, **base)


def test_the_timeline_keeps_the_last_hour_per_entity_and_forgets_what_is_no_longer_served():
    timeline = Timeline(keep_s=3600)
    for t in range(0, 4000, 10):
        timeline.add(("fraud", "main"), _point(float(t)))
    timeline.add(("fraud", "main"), _point(3990.0, requests=99))  # the same second again: not added
    kept = timeline.since("fraud", 0.0)["main"]
    assert kept[0].t == 390.0 and kept[-1].t == 3990.0 and kept[-1].requests == 10
    assert [p.t for p in timeline.last("fraud", 30)["main"]] == [3970.0, 3980.0, 3990.0]
    timeline.add(("other", "main"), _point(1.0))
    timeline.keep_only({("fraud", "main")})
    assert timeline.since("other", 0.0) == {}


def test_the_recorder_gives_each_point_the_5xx_of_its_second():
    timeline, counted = Timeline(), {("fraud", "main"): 3.0}
    history = SampleHistory(keep_s=60)
    scaler = SimpleNamespace(history=history, state=SimpleNamespace(replicas=3, target=2.5))
    recorder = TimelineRecorder(timeline, lambda: dict(counted))
    history.add(Sample(t=1.0, in_flight=2.0, ready_replicas=2, replicas=3, requests=40, completed=38))
    recorder.record({("fraud", "main"): scaler}, standby=1, now=100.0)  # type: ignore[dict-item]
    counted[("fraud", "main")] = 5.0
    history.add(Sample(t=2.0, in_flight=2.0, ready_replicas=3, replicas=3, requests=40, completed=40))
    recorder.record({("fraud", "main"): scaler}, standby=0, now=101.0)  # type: ignore[dict-item]
    first, second = timeline.since("fraud", 0.0)["main"]
    assert (first.errors, second.errors) == (3, 2)  # the counters' rise in each second
    assert (second.desired, second.ready, second.provisioned, second.target, first.standby) == (3, 3, 3, 2.5, 1)


def test_a_row_flags_what_needs_a_look():
    view = {
        "name": "fraud",
        "state": {"ready": "READY", "config_update": "NOT_UPDATING"},
        "config": {
            "served_entities": [
                {"name": "blue", "entity_name": "fraud", "entity_version": "3"},
                {"name": "green", "entity_name": "fraud", "entity_version": "4"},
            ],
            "traffic_config": {
                "routes": [
                    {"served_model_name": "blue", "traffic_percentage": 95},
                    {"served_model_name": "green", "traffic_percentage": 5},
                ]
            },
        },
    }
    points = {"blue": [_point(99.0, p99_ms=80.0, errors=6)], "green": [_point(99.0, p99_ms=900.0)]}
    canary = {"status": "active", "traffic": 5}
    drift = {"verdict": "findings", "findings": ["fraud/4: drift in amount"]}
    row = views.overview_row(
        view, points, {"blue": 2, "green": 1}, {"blue": 500.0, "green": 500.0}, canary, drift, 100.0
    )
    assert [(e["name"], e["version"], e["traffic_percentage"], e["ready"]) for e in row["entities"]] == [
        ("blue", "3", 95, 2),
        ("green", "4", 5, 1),
    ]
    assert row["ready_replicas"] == 3 and round(row["requests_per_s"], 3) == round(20 / 60, 3)
    assert row["error_ratio"] == pytest.approx(6 / 20)
    assert row["flags"] == [
        "p99 over the latency goal: green",
        "canary at 5 %",
        "the last monitoring run found 1 (skew or drift)",
    ]
    clean = {"verdict": "clean", "findings": []}
    quiet = views.overview_row({**view, "state": {"ready": "NOT_READY"}}, {}, {}, {}, None, clean, 100.0)
    assert quiet["flags"] == ["not ready"] and quiet["error_ratio"] is None
