"""The gateway's per-entity load meter: time-weighted in flight and queue depth (what is not being predicted),
arrivals, latency."""

from __future__ import annotations

import pytest

from serving.traffic.load_meter import LoadMeter


def test_in_flight_and_queue_depth_are_time_averaged_over_the_period():
    meter = LoadMeter(now=0.0)
    meter.arrived(0.0)  # 1 in flight, waiting
    meter.started(0.25)  # a replica predicts it after 0.25 s
    meter.arrived(0.5)  # a second one, waiting until the period ends
    meter.stopped(0.75)
    meter.finished(0.75, latency_s=0.75)
    reading = meter.read(1.0)
    # in flight: 1 for [0, 0.5), 2 for [0.5, 0.75), 1 for [0.75, 1.0) -> 1.25
    assert reading.in_flight == pytest.approx(1.25)
    # waiting: 1 for [0, 0.25), 0 for [0.25, 0.5), 1 for [0.5, 1.0) -> 0.75
    assert reading.queue_depth == pytest.approx(0.75)
    assert (reading.arrivals, reading.completed) == (2, 1)
    assert reading.latency_p50_ms == pytest.approx(750) and reading.latency_p99_ms == pytest.approx(750)
    following = meter.read(2.0)  # a new period: the one still waiting counts, nothing else happened
    assert following.in_flight == pytest.approx(1.0) and following.queue_depth == pytest.approx(1.0)
    assert (following.arrivals, following.completed, following.latency_p50_ms) == (0, 0, None)


def test_turned_away_requests_are_demand_but_not_load_and_counts_never_go_negative():
    meter = LoadMeter(now=0.0)
    meter.turned_away(0.1)
    meter.finished(0.2, latency_s=None)  # a stray completion cannot make the count negative
    reading = meter.read(1.0)
    assert reading.arrivals == 1 and reading.in_flight == 0 and reading.completed == 0
    for i in range(100):
        meter.arrived(1.0)
        meter.started(1.0)
        meter.stopped(1.0 + i / 1000)
        meter.finished(1.0 + i / 1000, latency_s=(i + 1) / 1000)
    reading = meter.read(2.0)
    assert reading.latency_p50_ms == pytest.approx(50, abs=1) and reading.latency_p99_ms == pytest.approx(99, abs=1)


def test_a_request_sent_to_a_replica_that_is_predicting_another_is_queued_not_in_service():
    """Busy requests over completions is the service time: a request waiting inside a replica must not add to it."""
    meter = LoadMeter(now=0.0)
    for _ in range(4):  # four requests sent at once to one serial replica
        meter.arrived(0.0)
    for k in range(4):  # it predicts them one after the other, 0.25 s each
        meter.started(k * 0.25)
        meter.stopped((k + 1) * 0.25)
        meter.finished((k + 1) * 0.25, latency_s=(k + 1) * 0.25)
    reading = meter.read(1.0)
    busy = reading.in_flight - reading.queue_depth
    assert reading.in_flight == pytest.approx(2.5)  # 4, 3, 2, 1 for a quarter each
    assert busy == pytest.approx(1.0)  # one request predicted at every moment
    assert busy / reading.completed == pytest.approx(0.25)  # the model's service time, not the 0.625 s latency
