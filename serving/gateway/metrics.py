"""Prometheus metrics of the gateway, in a registry of its own (one per app, so tests do not clash)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TOKEN_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
RATE_BUCKETS = (1, 5, 10, 20, 30, 50, 75, 100, 200, 500, 1000, 5000)
ENTITY = ["endpoint", "served_entity"]  # the labels of a per-entity metric
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True)
class GatewayMetrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    in_flight: Gauge
    replicas: Gauge
    max_replicas: Gauge
    latency_slo: Gauge
    drift_findings: Gauge
    canary_rolled_back: Gauge
    queue_depth: Gauge
    queue_limit: Gauge
    cache_hits: Counter
    shadow_requests: Counter
    shadow_skipped: Counter
    time_to_first_token: Histogram
    inter_token: Histogram
    output_tokens_per_s: Histogram
    streams: Gauge
    tokens: Counter
    fallbacks: Counter

    @classmethod
    def create(cls) -> GatewayMetrics:
        registry = CollectorRegistry()

        def per_entity(kind: type, name: str, doc: str, **options: object) -> Any:
            """A metric of ``kind`` labelled by endpoint and served entity, on the gateway's registry."""
            return kind(name, doc, ENTITY, registry=registry, **options)

        def per_endpoint(kind: type, name: str, doc: str) -> Any:
            return kind(name, doc, ["endpoint"], registry=registry)

        return cls(
            registry=registry,
            requests=Counter(
                "tollfree_requests_total",
                "Invocations by endpoint, served entity and HTTP status.",
                [*ENTITY, "status"],
                registry=registry,
            ),
            latency=per_entity(
                Histogram,
                "tollfree_request_latency_seconds",
                "Invocation latency at the gateway.",
                buckets=LATENCY_BUCKETS,
            ),
            in_flight=per_endpoint(Gauge, "tollfree_in_flight_requests", "Invocations in flight."),
            replicas=per_entity(Gauge, "tollfree_replicas", "Ready replicas per served entity."),
            max_replicas=per_entity(
                Gauge,
                "tollfree_max_replicas",
                "The most replicas the autoscaler may run per served entity (its max_replicas).",
            ),
            latency_slo=per_entity(
                Gauge,
                "tollfree_latency_slo_seconds",
                "The p99 latency goal per served entity (its autoscaling latency_slo_ms), in seconds.",
            ),
            drift_findings=per_endpoint(
                Gauge,
                "tollfree_drift_findings",
                "Findings of the endpoint's latest skew and drift run (0: clean); absent before its first.",
            ),
            canary_rolled_back=per_endpoint(
                Gauge,
                "tollfree_canary_rolled_back",
                "1 when the endpoint's latest canary ended rolled back, else 0; absent before its first canary.",
            ),
            queue_depth=per_entity(
                Gauge, "tollfree_queue_depth", "Requests waiting at the gateway for a replica, per served entity."
            ),
            queue_limit=per_entity(
                Gauge,
                "tollfree_queue_limit",
                "Requests that may wait at the gateway before the next is answered 429, per served entity.",
            ),
            cache_hits=per_endpoint(
                Counter, "tollfree_cache_hits_total", "Invocations answered from the response cache."
            ),
            shadow_requests=Counter(
                "tollfree_shadow_requests_total",
                "Copies of invocations a shadow answered, by endpoint, shadow entity and HTTP status (never sent to "
                "a client; not counted in tollfree_requests_total).",
                [*ENTITY, "status"],
                registry=registry,
            ),
            shadow_skipped=Counter(
                "tollfree_shadow_skipped_total",
                "Copies for a shadow not sent, by endpoint and reason: in_flight (the gateway's most copies in "
                "flight), busy (the shadow's queue is full), not_ready (the shadow has no replica yet).",
                ["endpoint", "reason"],
                registry=registry,
            ),
            **_chat_metrics(per_entity, registry),
        )

    def server_errors(self) -> dict[tuple[str, str], float]:
        """5xx answers counted so far, by (endpoint, served entity)."""
        out: dict[tuple[str, str], float] = {}
        for family in self.requests.collect():
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("status", "").startswith("5"):
                    key = (sample.labels["endpoint"], sample.labels["served_entity"])
                    out[key] = out.get(key, 0.0) + sample.value
        return out

    def exposition(self, endpoint: str | None = None) -> bytes:
        """Prometheus text; with ``endpoint``, only that endpoint's samples (the per-endpoint route)."""
        text = generate_latest(self.registry)
        if endpoint is None:
            return text
        label = f'endpoint="{endpoint}"'.encode()
        lines = [line for line in text.splitlines() if line.startswith(b"#") or label in line]
        return b"\n".join(lines) + b"\n"


def _chat_metrics(per_entity: Callable[..., Any], registry: CollectorRegistry) -> dict[str, Any]:
    """The chat streams' metrics (time to first token, inter-token gap, speed, streams, tokens, fallbacks)."""
    return {
        "time_to_first_token": per_entity(
            Histogram,
            "tollfree_time_to_first_token_seconds",
            "Chat streams: from the request's arrival to its first token, at the gateway.",
            buckets=TOKEN_BUCKETS,
        ),
        "inter_token": per_entity(
            Histogram,
            "tollfree_inter_token_seconds",
            "Chat streams: the gap between two tokens (chunks) the gateway passes on.",
            buckets=TOKEN_BUCKETS,
        ),
        "output_tokens_per_s": per_entity(
            Histogram,
            "tollfree_output_tokens_per_second",
            "Chat streams: output tokens a second, first token to last.",
            buckets=RATE_BUCKETS,
        ),
        "streams": per_entity(Gauge, "tollfree_streams_in_flight", "Chat streams being relayed."),
        "tokens": Counter(
            "tollfree_tokens_total",
            "Chat tokens used (the model's usage, else estimated), by direction.",
            [*ENTITY, "direction"],
            registry=registry,
        ),
        "fallbacks": per_entity(
            Counter, "tollfree_fallbacks_total", "Chat requests a served entity failed and handed to the next."
        ),
    }
