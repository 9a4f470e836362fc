"""What an endpoint serves right now: its served entities' replica sets and what its config says about routing
to them (traffic weights, response cache, stream inputs, external models). ``rollouts`` builds one after each
rollout (the leader), ``reconcile`` after each replica table refresh (a follower); the data plane and the stream
consumers read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.endpoints import spec
from serving.endpoints.external import ExternalModelInput
from serving.replicas.replica_set import ReplicaSet
from serving.streams.config import StreamInput
from serving.traffic.response_cache import ResponseCache


@dataclass
class LiveEndpoint:
    replica_sets: dict[str, ReplicaSet]  # by served entity name: the entities that run on replicas
    weights: list[tuple[str, int]]  # (served entity name, traffic percentage)
    cache: ResponseCache | None = None
    streams: tuple[StreamInput, ...] = ()  # the config's stream inputs (the leader runs their consumers)
    external: dict[str, ExternalModelInput] = field(default_factory=dict)  # served entities another server runs
    shadows: tuple[tuple[str, int], ...] = ()  # (served entity name, shadow percentage): serving.gateway.shadow

    @classmethod
    def of(cls, replica_sets: dict[str, ReplicaSet], config: spec.EndpointCoreConfig) -> LiveEndpoint:
        """``replica_sets`` served as ``config`` says."""
        return cls(
            replica_sets,
            spec.traffic_weights(config),
            cache_for(config),
            stream_inputs(config),
            external_models(config),
            spec.shadow_shares(config),
        )


def cache_for(config: spec.EndpointCoreConfig) -> ResponseCache | None:
    settings = config.response_cache
    if settings is None or not settings.enabled:
        return None
    return ResponseCache(settings.max_entries, float(settings.ttl_seconds))


def stream_inputs(config: spec.EndpointCoreConfig) -> tuple[StreamInput, ...]:
    return tuple(config.stream_inputs or ())


def external_models(config: spec.EndpointCoreConfig) -> dict[str, ExternalModelInput]:
    return {str(e.name): e.external_model for e in config.served_entities if e.external_model is not None}
