"""The serving-endpoints API's operations on endpoint records: create, update the config, delete, get, list.

A new or changed config is normalised, its external models' secrets checked and its aliases resolved to
registry versions before it is stored. The leader rolls it out at once (``rollouts``); on a follower it only
goes to the store, and the leader picks it up (``reconcile``).
"""

from __future__ import annotations

import time
import uuid

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec, validation
from serving.endpoints.ai_gateways import AiGateways
from serving.endpoints.resolver import VersionResolver
from serving.endpoints.rollouts import Rollouts
from serving.endpoints.store import EndpointStore
from serving.protocol.errors import conflict


class EndpointApi:
    def __init__(
        self, store: EndpointStore, resolver: VersionResolver, rollouts: Rollouts, ai_gateways: AiGateways
    ) -> None:
        self.store = store
        self._resolve = resolver
        self.rollouts = rollouts
        self.ai_gateways = ai_gateways

    async def create(self, request: spec.CreateEndpointRequest, creator: str) -> spec.EndpointRecord:
        name = validation.validate_endpoint_name(request.name)
        config = await self._accepted(request.config, name)
        now = int(time.time() * 1000)
        record = spec.EndpointRecord(
            name=name,
            id=uuid.uuid4().hex,
            creator=creator,
            created_ms=now,
            updated_ms=now,
            config=config,
            config_version=1,
            ready="NOT_READY",
            config_update="IN_PROGRESS",
            pending_config=None,
            ai_gateway=None,
            state_message=None,
        )
        await run_in_threadpool(self.store.create, record)
        if self.rollouts.leading:
            self.rollouts.spawn(name, config, record.config_version)
        return record

    async def update_config(self, name: str, raw: spec.EndpointCoreConfig) -> spec.EndpointRecord:
        record = await run_in_threadpool(self.store.get, name)
        if record.config_update == "IN_PROGRESS":
            # what Databricks answers while an update is in progress: 409, so clients and SDKs treat it as a conflict
            raise conflict(f"endpoint {name} has a config update in progress; retry when it ends")
        config = await self._accepted(validation.keep_extensions(raw, record.config), name)
        record.pending_config = config
        record.config_update = "IN_PROGRESS"
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.compare_and_set, name, record.config_version, record)
        if self.rollouts.leading:
            self.rollouts.spawn(name, config, record.config_version + 1)
        return record

    async def delete(self, name: str) -> None:
        """Remove the record, then cancel the endpoint's rollout and stop its replicas before answering."""
        await run_in_threadpool(self.store.delete, name)
        await self.rollouts.cancel(name)

    def get(self, name: str) -> spec.EndpointRecord:
        return self.store.get(name)

    def list(self) -> list[spec.EndpointRecord]:
        return self.store.list()

    async def _accepted(self, raw: spec.EndpointCoreConfig, name: str) -> spec.EndpointCoreConfig:
        """``raw`` normalised, with its secrets checked and every alias resolved to a registry version."""
        config = self.ai_gateways.check_secrets(validation.normalize_config(raw, name))
        for served_entity in spec.registry_entities(config):
            model = served_entity.entity_name
            assert model is not None  # normalize_config refuses a registry entity without one
            served_entity.resolved_version = await run_in_threadpool(
                self._resolve, model, served_entity.entity_version, served_entity.entity_alias
            )
        return config
