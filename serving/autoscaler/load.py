"""The load the horizontal axis sizes for, estimated from the per-second samples (pure functions).

A second's load is the concurrency its requests need: those in service, or, when more, its arrivals
times the measured service time (Little's law; requests turned away with a 429 still count as demand).
The service time is measured as busy requests over completions.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import statistics

from serving.autoscaler.config import ScalingConfig
from serving.autoscaler.signals import Sample, Signals

TREND_P = 0.05  # a rise counts as a trend when noise would rise so consistently less often than this


def service_s(samples: tuple[Sample, ...]) -> float | None:
    """Mean service time of ``samples``: busy requests over completions (None without completions)."""
    completed = sum(s.completed for s in samples)
    if completed <= 0:
        return None
    return sum(max(0.0, s.in_flight - s.queue_depth) for s in samples) / completed


def recent_service_s(config: ScalingConfig, signals: Signals, now: float) -> float | None:
    """The service time over the last decision interval (it moves with batch sizes), else the last 20 s."""
    return service_s(signals.since(now - config.decision_interval_s)) or service_s(
        signals.since(now - config.scale_up_window_s)
    )


def load(s: Sample, service: float | None) -> float:
    """A second's concurrency: in service, or its arrivals x ``service`` when more; without a measured
    service time, the in-flight count (queued included)."""
    if service is None:
        return s.in_flight
    return max(max(0.0, s.in_flight - s.queue_depth), s.requests * service)


def max_load(signals: Signals, now: float, window_s: float, service: float | None) -> float | None:
    """The largest :func:`load` of the samples of the last ``window_s`` (None without samples)."""
    values = [load(s, service) for s in signals.since(now - window_s)]
    return max(values) if values else None


def forecast(samples: tuple[Sample, ...], service: float | None, lead_s: float) -> float | None:
    """The load ``lead_s`` seconds after the last of ``samples`` (one a second, at least three): the last
    second's load plus the trend's rise over the lead time. The trend is the median slope over every pair of
    seconds (Theil-Sen), counted only when the seconds rise more consistently than noise would (Mann-Kendall:
    more pairs rising than falling by a margin that exchangeable values reach with probability under
    ``TREND_P``). A step moves only the pairs across it, a minority: no trend, where a ramp moves them all. A
    falling trend forecasts no fall (the scale-down window decides that). None without enough samples."""
    if len(samples) < 3:
        return None
    loads = [load(s, service) for s in samples]
    pairs = [(i, j) for i in range(len(loads)) for j in range(i + 1, len(loads)) if samples[j].t > samples[i].t]
    rising = sum((loads[j] > loads[i]) - (loads[j] < loads[i]) for i, j in pairs)
    if rising < _kendall_critical(len(loads), TREND_P):
        return loads[-1]
    trend = statistics.median((loads[j] - loads[i]) / (samples[j].t - samples[i].t) for i, j in pairs)
    return loads[-1] + max(0.0, trend) * max(0.0, lead_s)


@functools.cache
def _kendall_critical(n: int, p: float) -> int:
    """The smallest Mann-Kendall S (pairs rising less pairs falling) that ``n`` exchangeable values reach with
    probability at most ``p``: exact, over the ``n!`` orders (``n`` is a handful of seconds)."""
    counts = collections.Counter(
        sum((b > a) - (b < a) for a, b in itertools.combinations(order, 2))
        for order in itertools.permutations(range(n))
    )
    total, tail, critical = math.factorial(n), 0, n * (n - 1) // 2 + 1
    for value in sorted(counts, reverse=True):
        tail += counts[value]
        if tail / total > p:
            break
        critical = value
    return critical


MIN_MEASURED = 10  # requests served in an interval before its busiest second is taken for the replicas' rate
MIN_SECONDS = 3  # seconds of samples the rate is read over, older ones included when the interval has fewer


MEASURED_BUSY = 0.05  # a busy share below this is too small to scale a second's completions by


def _served_rate(sample: Sample) -> float:
    """What the ready replicas serve a second, as one second showed it: its completions over the share of
    the replicas' time they were busy (``Sample.utilisation``). A second the replicas were idle for the most
    part (load that began late in it, a few clients) shows what was asked, not what they serve; scaled by
    the busy share it shows both. The plain completions where no busy share was measured (or too little)."""
    util = sample.utilisation
    if util is None or util < MEASURED_BUSY:
        return float(sample.completed)
    return sample.completed / min(1.0, util)


def queue_bound(config: ScalingConfig, signals: Signals, now: float, goal: float) -> int:
    """How many requests may wait at the gateway: what the replicas serve within ``goal`` of the SLO
    (``rate x (goal x SLO - service time)``), so a request admitted can still meet it and the rest get a
    fast 429. The rate is the busiest second's of the last interval, each second's completions over its busy
    share (``_served_rate``): what the replicas showed they serve, not an average that the interval's idle
    seconds dilute nor the few answers of a second in which load only began (load starting after a pause
    would otherwise be refused as though the replicas were slow). ``max_queue`` while fewer than
    ``MIN_MEASURED`` requests were served in the last interval: a rate measured on a request or two (scale from
    zero, the first second of load after an idle spell) says what was asked, not what the replicas serve, and
    would refuse the load that follows. An interval with fewer than ``MIN_SECONDS`` samples (a leader that took
    over continues from its predecessor's recorded seconds, which end before the takeover) is read with the
    seconds before it, so the new leader's first partial seconds are not taken for what the replicas serve."""
    recent = signals.since(now - config.decision_interval_s)
    if len(recent) < MIN_SECONDS:  # a history that only begins (a new leader's first seconds): the seconds before
        recent = signals.samples[-MIN_SECONDS:]
    if not recent:
        return config.max_queue
    n = len(recent)
    completed = sum(s.completed for s in recent)
    throughput = completed / n
    if completed < MIN_MEASURED or recent[-1].ready_replicas == 0:
        return config.max_queue
    busy = sum(max(0.0, s.in_flight - s.queue_depth) for s in recent) / n
    rate = max(_served_rate(s) for s in recent)
    wait_s = goal * config.latency_slo_ms / 1000.0 - busy / throughput
    return int(min(config.max_queue, max(1, math.ceil(rate * max(0.0, wait_s)))))
