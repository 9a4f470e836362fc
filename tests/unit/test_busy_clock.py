"""A replica's busy clock and the utilisation the gateway reads from it: overlapping predict calls count
once, the call in progress counts, and a second with no answer is busy exactly when requests are out; the
machine's busy share from /proc/stat."""

from __future__ import annotations

import pytest

from serving.gateway.scaling_signals import MachineCpu, busy_share
from serving.replica_server.metrics import BusyClock, ReplicaMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_counts_overlapping_calls_once_and_includes_the_running_call():
    clock = Clock()
    busy = BusyClock(clock)
    assert busy.total() == 0.0
    first = busy.__enter__()
    clock.now += 0.2
    assert busy.total() == pytest.approx(0.2)  # the call in progress
    with busy:  # a second call overlaps the first for 0.3 s
        clock.now += 0.3
    assert busy.total() == pytest.approx(0.5)
    clock.now += 0.1
    first.__exit__(None, None, None)
    assert busy.total() == pytest.approx(0.6)  # wall time with at least one call: never faster than the clock
    clock.now += 5.0  # idle: the clock stands still
    assert busy.total() == pytest.approx(0.6)
    with pytest.raises(RuntimeError), busy:
        clock.now += 0.4
        raise RuntimeError("a failed call is busy time too")
    assert busy.total() == pytest.approx(1.0)


def test_the_replica_exposes_its_busy_seconds_as_a_counter():
    metrics = ReplicaMetrics.create("models:/m/1")
    with metrics.busy:
        pass
    text = metrics.exposition().decode()
    line = next(
        x for x in text.splitlines() if x.startswith('tollfree_replica_busy_seconds_total{model_uri="models:/m/1"}')
    )
    assert 0.0 <= float(line.split()[-1]) < 1.0
    assert "# TYPE tollfree_replica_busy_seconds_total counter" in text


@pytest.mark.parametrize(
    ("before", "after", "seconds", "outstanding", "share"),
    [
        (10.0, 10.25, 1.0, 0, 0.25),  # a quarter of the second predicting (a sleeping model: CPU would say ~0)
        (10.0, 10.25, 0.5, 3, 0.5),  # over a shorter interval
        (10.0, 13.0, 1.0, 1, 1.0),  # a long call answered now: its seconds are not spread past 1
        (10.0, 10.0, 1.0, 2, 1.0),  # no answer, requests out: a call longer than the second is running
        (10.0, 10.0, 1.0, 0, 0.0),  # no answer, nothing out: idle
        (10.0, 4.0, 1.0, 0, 0.0),  # a clock that went back (another process): no evidence of work
    ],
)
def test_the_busy_share_of_an_interval(before, after, seconds, outstanding, share):
    assert busy_share(before, after, seconds, outstanding) == pytest.approx(share)


def test_the_machines_busy_share_between_two_reads_of_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    machine = MachineCpu(str(stat))
    assert machine.read() is None  # no file: nothing known
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert machine.read() is None  # the first read only starts the count
    stat.write_text("cpu  250 0 100 850 50 0 0 0 0 0\ncpu0 1 2 3 4\n")  # 200 busy, 50 idle ticks since
    assert machine.read() == pytest.approx(0.8)
    stat.write_text("cpu  250 0 100 850 50 0 0 0 0 0\n")  # no tick passed: no share
    assert machine.read() is None
