"""Prometheus metrics of the gateway, in a registry of its own (one per app, so tests do not clash)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    in_flight: Gauge
    replicas: Gauge
    queue_depth: Gauge
    cache_hits: Counter

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter(
                "tollfree_requests_total", "Invocations by endpoint, served entity and HTTP status.",
                ["endpoint", "served_entity", "status"], registry=registry,
            ),
            latency=Histogram(
                "tollfree_request_latency_seconds", "Invocation latency at the gateway.",
                ["endpoint", "served_entity"], buckets=LATENCY_BUCKETS, registry=registry,
            ),
            in_flight=Gauge("tollfree_in_flight_requests", "Invocations in flight.", ["endpoint"], registry=registry),
            replicas=Gauge("tollfree_replicas", "Ready replicas per served entity.", ["endpoint", "served_entity"], registry=registry),
            queue_depth=Gauge("tollfree_queue_depth", "Requests waiting at the gateway for a replica, per served entity.",
                              ["endpoint", "served_entity"], registry=registry),
            cache_hits=Counter("tollfree_cache_hits_total", "Invocations answered from the response cache.", ["endpoint"],
                               registry=registry),
        )

    def exposition(self, endpoint: str | None = None) -> bytes:
        """Prometheus text; with ``endpoint``, only that endpoint's samples (the per-endpoint route)."""
        text = generate_latest(self.registry)
        if endpoint is None:
            return text
        label = f'endpoint="{endpoint}"'.encode()
        lines = [line for line in text.splitlines() if line.startswith(b"#") or label in line]
        return b"\n".join(lines) + b"\n"
