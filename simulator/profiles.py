"""Model profiles for the simulator: how a replica of a model behaves under load.

A replica serves up to ``parallelism`` requests at once at full speed; requests admitted beyond that
wait inside it (so latency grows past the parallelism). With ``max_batch`` > 1 each of the
``parallelism`` workers takes every waiting request (up to ``max_batch``, and up to the replica's
admission limit over its parallelism where the serving system sets one) as one batch whose time is
``t1 x (1 + batch_marginal x (n - 1))``. Starting a replica costs ``cold_start_s`` (process or pod
start and runtime import) or ``warm_start_s`` (a standby of a warm pool, see starts.py), plus
``model_load_s``.

Replicas that share one machine (local processes, as the fidelity run's) set ``machine_cores``: a busy
server uses ``cpu_share`` of a core, and when the busy servers want more cores than the machine has,
every service started meanwhile is stretched in proportion (processor sharing), and each second's
``Sample`` carries the cores and their busy share as the live gateway's does. 0: each replica on its
own machine (pods), no such sample.

Presets are named in :data:`PRESETS`; :func:`load_profile` also reads a YAML or JSON file with the same
fields.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class ModelProfile:
    name: str
    service_ms: float  # median time of one request (or of a batch of one)
    service_sigma: float  # lognormal shape of the service time
    parallelism: int  # requests (or batches) one replica serves at full speed at once
    slo_ms: float  # the latency SLO requests are judged against
    user_target: float  # per-replica concurrency a user would set after a load test (HPA)
    max_batch: int = 1
    batch_marginal: float = 0.0  # extra batch time per extra item, as a share of one item's time
    model_load_s: float = 10.0
    cold_start_s: float = 8.0
    warm_start_s: float = 0.5
    # The model server's own waiting room per replica (what a replica accepts beyond its parallelism
    # and refuses past): None -- unbounded, a plain HTTP server's default (uvicorn's limit_concurrency
    # is None, uvicorn's uvicorn/config.py; KServe's model server runs on it). A system
    # that limits what reaches a replica (a gateway, a queue-proxy breaker, a router) overrides it in
    # the simulator.
    queue_limit: int | None = None
    max_replicas: int = 1000
    machine_cores: int = 0  # the replicas share a machine of this many cores (0: their own machines)
    cpu_share: float = 1.0  # of a request's service time, the share a core is busy (a waiting model: ~0)

    def __post_init__(self) -> None:
        for name in ("service_ms", "parallelism", "slo_ms", "user_target", "max_batch", "max_replicas"):
            if not getattr(self, name) > 0:
                raise ValueError(f"profile {self.name!r}: {name} must be positive")
        for name in (
            "service_sigma",
            "batch_marginal",
            "model_load_s",
            "cold_start_s",
            "warm_start_s",
            "machine_cores",
            "cpu_share",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"profile {self.name!r}: {name} must not be negative")
        if self.queue_limit is not None and self.queue_limit < 0:
            raise ValueError(f"profile {self.name!r}: queue_limit must not be negative")

    @property
    def mean_service_s(self) -> float:
        return self.service_ms / 1000.0 * math.exp(self.service_sigma**2 / 2)

    def batch_factor(self, n: int) -> float:
        return 1.0 + self.batch_marginal * (n - 1)

    def replica_rps(self, admission_limit: int | None = None) -> float:
        """Throughput of one ready replica when saturated (with at most ``admission_limit`` inside)."""
        if self.max_batch > 1:
            batch = min(self.max_batch, admission_limit or self.max_batch)
            return self.parallelism * batch / (self.mean_service_s * self.batch_factor(batch))
        slots = min(self.parallelism, admission_limit or self.parallelism)
        return slots / self.mean_service_s

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS: dict[str, ModelProfile] = {
    # A CPU-bound model (gradient-boosted trees, small CNN): one request per core, 4 cores a replica.
    # A user would load-test it, see latency rise past 4 in flight, and set 70 % of that.
    "cpu": ModelProfile(
        name="cpu", service_ms=40.0, service_sigma=0.4, parallelism=4, slo_ms=200.0, user_target=2.8, model_load_s=10.0
    ),
    # An I/O-bound agent: each request mostly waits on tools/LLM calls; hundreds in flight a replica.
    "io_agent": ModelProfile(
        name="io_agent",
        service_ms=1500.0,
        service_sigma=0.6,
        parallelism=256,
        slo_ms=10000.0,
        user_target=180.0,
        model_load_s=10.0,
    ),
    # A batch-friendly embedding model: one worker a replica batches what waits (up to 64); a batch of n
    # costs 1 + 0.08 (n - 1) times a single request. Users would set ~70 % of the batch that fills in SLO.
    "embedding": ModelProfile(
        name="embedding",
        service_ms=15.0,
        service_sigma=0.2,
        parallelism=1,
        max_batch=64,
        batch_marginal=0.08,
        slo_ms=150.0,
        user_target=11.0,
        model_load_s=10.0,
    ),
}


def load_profile(name_or_path: str) -> ModelProfile:
    """A preset by name, or a profile from a ``.yaml``/``.yml``/``.json`` file (fields as above)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(f"profile {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) nor a file")
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError(f"profile file {path}: expected a mapping of fields")
    known = {f.name for f in fields(ModelProfile)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"profile file {path}: unknown field(s) {unknown}")
    data.setdefault("name", path.stem)
    try:
        return ModelProfile(**data)
    except TypeError as exc:
        raise ValueError(f"profile file {path}: {exc}") from None
