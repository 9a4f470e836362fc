"""A served entity's autoscaler settings: its Databricks-level replica fields and its ``autoscaling`` block
read into the autoscaler's ``ScalingConfig``."""

from __future__ import annotations

import logging
from typing import Any

from serving.autoscaler.config import REMOVED, ScalingConfig, ScalingConfigError
from serving.endpoints.spec import ServedEntityInput

log = logging.getLogger(__name__)

DEFAULT_MAX_REPLICAS = 4  # local processes on one machine; set max_replicas for more
_ENTITY_LEVEL = ("min_replicas", "max_replicas", "scale_to_zero")


def scaling_config(e: ServedEntityInput, *, stored: bool = False) -> ScalingConfig:
    """The autoscaler's config for a served entity: the Databricks-level fields (min/max replicas,
    scale_to_zero_enabled, max_concurrency) plus its ``autoscaling`` block. A fixed ``max_concurrency``
    turns the vertical axis off and sets the per-replica target from it. ``stored``: a config accepted
    before a field was removed (``config.REMOVED``) rolls out without it, with a warning, where a new
    request naming it is refused."""
    extra = dict(e.autoscaling or {})
    for key in sorted(set(extra) & set(REMOVED) if stored else ()):
        log.warning("served entity %s: autoscaling.%s is no longer a setting, ignored: %s", e.name, key, REMOVED[key])
        del extra[key]
    for key in _ENTITY_LEVEL:
        if key in extra:
            raise ScalingConfigError(key, "set it on the served entity, not in autoscaling")
    base: dict[str, Any] = {
        "min_replicas": e.min_replicas if e.min_replicas is not None else (0 if e.scale_to_zero_enabled else 1),
        "max_replicas": e.max_replicas
        if e.max_replicas is not None
        else max(DEFAULT_MAX_REPLICAS, e.min_replicas or 0),
        "scale_to_zero": e.scale_to_zero_enabled,
    }
    if e.max_concurrency is not None and "initial_target" not in extra:
        headroom = float(extra.get("admission_headroom", 1.5))
        target = max(1.0, e.max_concurrency / headroom)
        base.update(
            vertical=False,
            initial_target=target,
            min_target=min(target, float(extra.get("min_target", 1.0))),
            max_target=max(target, float(extra.get("max_target", 1024.0))),
        )
    return ScalingConfig.from_mapping({**base, **extra})
