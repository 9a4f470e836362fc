"""What the drift flow watches: every serving endpoint, and every edge device group as the endpoint ``edge:GROUP``
(the records its devices uploaded, ``serving.edge.api``)."""

from __future__ import annotations

from serving.edge.api import ENDPOINT_PREFIX, log_endpoint
from serving.edge.fleet import Fleet
from serving.endpoints.monitoring_settings import MonitoringConfig
from serving.endpoints.store import EndpointStore
from serving.settings import Settings


def monitored(settings: Settings) -> list[str]:
    """The endpoints' names, then the device groups' log endpoints."""
    store = EndpointStore(settings.state_url)
    return [r.name for r in store.list()] + [log_endpoint(g) for g in Fleet(store.database).groups()]


def monitoring_of(settings: Settings, endpoint: str) -> tuple[MonitoringConfig, dict[str, str] | None]:
    """The endpoint's monitoring settings and its served entities' models (entity -> model); a device group has
    the default settings, and its records name the model itself as the served entity (None here)."""
    if endpoint.startswith(ENDPOINT_PREFIX):
        return MonitoringConfig(), None
    record = EndpointStore(settings.state_url).get(endpoint)
    models = {str(e.name): e.entity_name for e in record.config.served_entities if e.entity_name is not None}
    return record.config.monitoring or MonitoringConfig(), models
