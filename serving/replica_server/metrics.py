"""Prometheus metrics of one model replica, served at its ``GET /metrics`` (replica token required).

The gateway's metrics say what clients saw; these say what the replica did: answers by status, the
time of each predict call (a micro-batch or a single request), how many requests each call carried,
the model load time, the seconds its predict calls kept it busy, and the process's CPU and resident
memory (prometheus-client's process collector). On Kubernetes each model-replica pod is scraped for them;
locally the gateway's are enough.

:class:`BusyClock` is the replica's utilisation at its source: the rate of its busy seconds is the share
of its predict capacity in use, whatever the model spends that time on (a CPU-bound tree model and one
that waits on a remote call look the same to it, where the process's CPU sees only the first). Each
envelope answer carries the counter in the ``x-tollfree-busy-s`` header (``protocol.wire.BUSY_HEADER``), so
the gateway's autoscaler reads it off the traffic without a scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import TracebackType

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class BusyClock:
    """Seconds during which at least one predict call was running, the call in progress included.

    Use ``with clock:`` around each call; calls that overlap (the inline single-request path beside the
    worker thread) count once, so the counter never runs faster than the wall clock and its rate is the
    replica's busy share, 0..1. Thread-safe; ``clock`` is injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._total = 0.0

    def __enter__(self) -> BusyClock:
        with self._lock:
            if self._active == 0:
                self._since = self._clock()
            self._active += 1
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._total += self._clock() - self._since

    def total(self) -> float:
        """Busy seconds so far, the running call's elapsed time included."""
        with self._lock:
            return self._total + (self._clock() - self._since if self._active else 0.0)


class _BusyCollector(Collector):
    def __init__(self, model_uri: str, busy: BusyClock) -> None:
        self._model_uri = model_uri
        self._busy = busy

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "tollfree_replica_busy_seconds",
            "Seconds at least one predict call was running (its rate is the busy share).",
            labels=["model_uri"],
        )
        family.add_metric([self._model_uri], self._busy.total())
        yield family


PREDICT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass(frozen=True)
class ReplicaMetrics:
    model_uri: str
    registry: CollectorRegistry
    answers: Counter
    predict_seconds: Histogram
    batch_requests: Histogram
    load_seconds: Gauge
    busy: BusyClock = field(default_factory=BusyClock)

    @classmethod
    def create(cls, model_uri: str, load_seconds: float | None = None) -> ReplicaMetrics:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        metrics = cls(
            model_uri=model_uri,
            registry=registry,
            answers=Counter(
                "tollfree_replica_answers_total",
                "Requests answered by this replica, by HTTP status.",
                ["model_uri", "status"],
                registry=registry,
            ),
            predict_seconds=Histogram(
                "tollfree_replica_predict_seconds",
                "Wall time of one predict call (a micro-batch or a single request).",
                ["model_uri"],
                buckets=PREDICT_BUCKETS,
                registry=registry,
            ),
            batch_requests=Histogram(
                "tollfree_replica_batch_requests",
                "Requests carried by one predict call.",
                ["model_uri"],
                buckets=BATCH_BUCKETS,
                registry=registry,
            ),
            load_seconds=Gauge(
                "tollfree_replica_model_load_seconds",
                "Seconds to load, warm and profile the model.",
                ["model_uri"],
                registry=registry,
            ),
        )
        registry.register(_BusyCollector(model_uri, metrics.busy))
        if load_seconds is not None:
            metrics.load_seconds.labels(model_uri).set(load_seconds)
        return metrics

    def observe_call(self, seconds: float, statuses: Iterable[int]) -> None:
        """One predict call and the status of each request it answered."""
        uri = self.model_uri
        counted = 0
        for status in statuses:
            self.answers.labels(uri, str(status)).inc()
            counted += 1
        self.predict_seconds.labels(uri).observe(seconds)
        self.batch_requests.labels(uri).observe(counted)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
