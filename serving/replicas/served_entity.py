"""A served entity's live state: its running replicas, their concurrency limit, its dispatcher and its
scaling config. Rollouts (``endpoints.manager``) create it, the local backend adds and removes its
replicas, the autoscaler sets its limits, and the data plane reads it through its dispatcher."""

from __future__ import annotations

from dataclasses import dataclass, field

from serving.autoscaler.config import ScalingConfig
from serving.replicas.local import LocalReplica
from serving.traffic.dispatcher import Dispatcher, SendBatch

DEFAULT_MAX_CONCURRENCY = 32


@dataclass
class ServedEntity:
    """A served entity's running replicas."""

    name: str
    model_name: str
    version: str
    replicas: list[LocalReplica] = field(default_factory=list)
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    dispatcher: Dispatcher | None = None  # set by the manager (or a test) before traffic reaches the entity
    scaling: ScalingConfig | None = None  # the autoscaler's config for it (None: not autoscaled)

    def attach(self, send: SendBatch, timeout_s: float = 30.0) -> Dispatcher:
        """Give the entity its dispatcher: requests queue here and go to its replicas in batches."""
        self.dispatcher = Dispatcher(send, lambda: self.replicas, limit=lambda: self.max_concurrency, timeout_s=timeout_s)
        return self.dispatcher

    @property
    def model_uri(self) -> str:
        return f"models:/{self.model_name}/{self.version}"

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.model_name, self.version, len(self.replicas))
