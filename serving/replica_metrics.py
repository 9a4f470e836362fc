"""Prometheus metrics of one model replica, served at its ``GET /metrics`` (replica token required).

The gateway's metrics say what clients saw; these say what the replica did: answers by status, the
time of each predict call (a micro-batch or a single request), how many requests each call carried,
the model load time, and the process's CPU and resident memory (prometheus-client's process
collector). On Kubernetes each model-replica pod is scraped for them; locally the gateway's are enough.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

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

    @classmethod
    def create(cls, model_uri: str, load_seconds: float | None = None) -> ReplicaMetrics:
        registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        metrics = cls(
            model_uri=model_uri,
            registry=registry,
            answers=Counter("tollfree_replica_answers_total", "Requests answered by this replica, by HTTP status.",
                            ["model_uri", "status"], registry=registry),
            predict_seconds=Histogram("tollfree_replica_predict_seconds",
                                      "Wall time of one predict call (a micro-batch or a single request).",
                                      ["model_uri"], buckets=PREDICT_BUCKETS, registry=registry),
            batch_requests=Histogram("tollfree_replica_batch_requests", "Requests carried by one predict call.",
                                     ["model_uri"], buckets=BATCH_BUCKETS, registry=registry),
            load_seconds=Gauge("tollfree_replica_model_load_seconds", "Seconds to load, warm and profile the model.",
                               ["model_uri"], registry=registry),
        )
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
