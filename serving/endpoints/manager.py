"""The control plane's live state: endpoints and the replica set of each served entity.

Records persist in the EndpointStore; replicas are local processes, each listed in the replica registry
while it serves. A config change starts the new served entities' replicas, waits until they are ready,
and only then moves traffic to them; a failed rollout ends UPDATE_FAILED and the old config keeps
serving. A gateway that starts on existing state adopts the live replicas a crashed predecessor left
(registry, then health check, then ``/adopt``), starts only what is missing, and stops the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec
from serving.endpoints.monitoring import keep_monitoring
from serving.endpoints.store import EndpointStore
from serving.protocol.errors import conflict, invalid_parameter, not_found, unavailable
from serving.registry import versions
from serving.replicas.local import (Launcher, ReplicaOwned, ReplicaStartError, adopt_replica, process_running,
                                    stop_stray)
from serving.replicas.local_backend import LocalBackend
from serving.replicas.replica_set import DEFAULT_MAX_CONCURRENCY, ReplicaSet
from serving.state.replica_registry import ReplicaRegistry, ReplicaRow
from serving.traffic.response_cache import ResponseCache

log = logging.getLogger(__name__)


@dataclass
class LiveEndpoint:
    entities: dict[str, ReplicaSet]
    weights: list[tuple[str, int]]
    cache: ResponseCache | None = None


def cache_for(config: spec.EndpointCoreConfig) -> ResponseCache | None:
    settings = config.response_cache
    if settings is None or not settings.enabled:
        return None
    return ResponseCache(settings.max_entries, float(settings.ttl_seconds))


VersionResolver = Callable[[str, "str | None", "str | None"], str]


def mlflow_resolver(tracking_uri: str) -> VersionResolver:
    """Resolve (model, version, alias) to a registry version; 400 naming the model if it is not there, 503
    if the registry does not answer."""

    def resolve(model_name: str, version: str | None, alias: str | None) -> str:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        try:
            found = versions.resolve(MlflowClient(tracking_uri), model_name, alias or str(version), alias=bool(alias))
        except LookupError as exc:
            raise invalid_parameter(str(exc)) from exc
        except MlflowException as exc:  # resolve lets through only a registry that did not answer
            raise unavailable(f"the MLflow registry did not answer while resolving {model_name}") from exc
        return str(found.version)

    return resolve


class EndpointManager:
    def __init__(
        self,
        store: EndpointStore,
        resolver: VersionResolver,
        replica_env: Mapping[str, str],
        log_dir: Path,
        *,
        home: Path | None = None,
        ready_timeout_s: float = 180.0,
        replica_client=None,  # type: ignore[no-untyped-def]  # has start/close/send; default: ReplicaClient
        request_timeout_s: float = 30.0,
    ) -> None:
        self.store = store
        self.registry = ReplicaRegistry(store.database)
        self._resolve = resolver
        self._home = home or log_dir.parent
        self.launcher = Launcher.for_gateway(replica_env, log_dir, token_file=self._home / "replica.token")
        self.backend = LocalBackend(self.launcher)   # its warm pool comes with the autoscaler (gateway.app)
        if replica_client is None:
            from serving.replicas.client import ReplicaClient

            replica_client = ReplicaClient(self.launcher.token)
        self.replica_client = replica_client
        self.request_timeout_s = request_timeout_s
        self._ready_timeout_s = ready_timeout_s
        self.live: dict[str, LiveEndpoint] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restoring: dict[str, asyncio.Event] = {}  # set once the restored endpoint is live (or failed)
        self._recording: dict[tuple[str, str, str], asyncio.Lock] = {}  # one registry write at a time per entity
        self._record_tasks: set[asyncio.Task[None]] = set()

    # ---- control plane -------------------------------------------------------------------------
    async def create(self, request: spec.CreateEndpointRequest, creator: str) -> spec.EndpointRecord:
        name = spec.validate_endpoint_name(request.name)
        config = await self._resolved(spec.normalize_config(request.config, name))
        now = int(time.time() * 1000)
        record = spec.EndpointRecord(
            name=name, id=uuid.uuid4().hex, creator=creator, created_ms=now, updated_ms=now,
            config=config, config_version=1, ready="NOT_READY", config_update="IN_PROGRESS",
            pending_config=None, ai_gateway=None, state_message=None,
        )
        await run_in_threadpool(self.store.create, record)
        self._spawn(name, self._deploy(name, config, record.config_version))
        return record

    async def update_config(self, name: str, raw: spec.EndpointCoreConfig) -> spec.EndpointRecord:
        record = await run_in_threadpool(self.store.get, name)
        if record.config_update == "IN_PROGRESS":
            # what Databricks answers while an update is in progress: 409, so clients and SDKs treat it as a conflict
            raise conflict(f"endpoint {name} has a config update in progress; retry when it ends")
        config = await self._resolved(spec.normalize_config(keep_monitoring(raw, record.config), name))
        record.pending_config = config
        record.config_update = "IN_PROGRESS"
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.compare_and_set, name, record.config_version, record)
        self._spawn(name, self._deploy(name, config, record.config_version + 1))
        return record

    async def delete(self, name: str) -> None:
        await run_in_threadpool(self.store.delete, name)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)  # its replicas are stopped before delete answers
        live = self.live.pop(name, None)
        if live is not None:
            await self._stop_all(live.entities.values())

    async def set_ai_gateway(self, name: str, body: dict) -> dict:
        """Store the endpoint's AI-gateway settings (inference table config, ...); no replica restarts."""
        allowed = {"inference_table_config", "usage_tracking_config", "rate_limits", "guardrails", "fallback_config"}
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise invalid_parameter(f"unknown ai-gateway field(s): {', '.join(k[:64] for k in unknown[:5])}")
        record = await run_in_threadpool(self.store.get, name)
        record.ai_gateway = body
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.put, record)
        return body

    async def openapi(self, name: str) -> dict:
        from serving.endpoints.openapi import endpoint_openapi, model_inputs

        record = await run_in_threadpool(self.store.get, name)
        entities = {}
        for entity in record.config.served_entities:
            uri = f"models:/{entity.entity_name}/{entity.resolved_version}"
            entities[str(entity.name)] = await run_in_threadpool(model_inputs, uri, self._home)
        return endpoint_openapi(name, entities)

    async def open(self) -> None:
        await self.replica_client.start()

    async def restore(self) -> None:
        """On gateway start: bring every stored endpoint's current config back up.

        Until its replicas can answer, an endpoint is ``NOT_READY`` and its requests wait for them (up to
        the request timeout) rather than failing: it was serving before the restart, and its clients
        should see a slow answer, not an error."""
        records = await run_in_threadpool(self.store.list)
        left = await self._left_running(records)
        for record in records:
            record.ready = "NOT_READY"
            record.config_update = "IN_PROGRESS"
            record.pending_config = None
            record.state_message = "the gateway restarted: starting the endpoint's replicas"
            await run_in_threadpool(self.store.put, record)
            self._restoring[record.name] = asyncio.Event()
            self._spawn(record.name, self._deploy(record.name, record.config, record.config_version, left))

    async def _left_running(self, records: list[spec.EndpointRecord]) -> dict[tuple[str, str, str], list[ReplicaRow]]:
        """The registry's replicas whose gateway is gone: those of the stored endpoints' entities, by entity, to
        adopt; those of anything else (an endpoint deleted or changed meanwhile) are stopped and forgotten."""
        try:
            rows = await run_in_threadpool(self.registry.all)
        except Exception as exc:  # noqa: BLE001 - start without adopting: every replica starts anew
            log.warning("replica registry unreadable (%s): no replica adopted", type(exc).__name__)
            return {}
        wanted = {(r.name, str(e.name), f"models:/{e.entity_name}/{e.resolved_version}")
                  for r in records for e in r.config.served_entities}
        by_entity: dict[tuple[str, str, str], list[ReplicaRow]] = {}
        strays = []
        for row in rows:
            if row.owner_pid != os.getpid() and process_running(row.owner_pid):
                continue  # another gateway on this state runs it: not ours to adopt or stop
            if row.key in wanted and row.backend == "local":
                by_entity.setdefault(row.key, []).append(row)
            else:
                strays.append(row)
        for row in strays:
            await run_in_threadpool(stop_stray, row.pid, row.port)
        if strays:
            log.info("stopped %d replica(s) left running that no endpoint needs", len(strays))
            try:
                await run_in_threadpool(self.registry.forget, strays)
            except Exception as exc:  # noqa: BLE001 - a stale row is harmless: the next start checks it again
                log.warning("replica registry not updated: %s", type(exc).__name__)
        return by_entity

    async def _adopt(self, served: ReplicaSet, rows: list[ReplicaRow]) -> int:
        """Adopt the live replicas among ``rows`` into ``served``; dead or foreign ones are stopped. How many."""
        adopted = 0
        gone = []
        for row in rows:
            try:
                taken = await run_in_threadpool(adopt_replica, row.host, row.port, row.pid, row.model_uri,
                                                self.launcher.token, self.launcher.log_dir)
            except ReplicaOwned as exc:
                log.info("not adopted: %s", exc)
                continue
            if taken is None:
                await run_in_threadpool(stop_stray, row.pid, row.port)
                gone.append(row)
                continue
            replica, ready = taken
            replica.started_at = row.started_at
            served.adopt(replica, ready)  # its row is rewritten under this gateway
            adopted += 1
        if gone:
            try:
                await run_in_threadpool(self.registry.forget, gone)
            except Exception as exc:  # noqa: BLE001 - a stale row is harmless: the next start checks it again
                log.warning("replica registry not updated: %s", type(exc).__name__)
        return adopted

    def _replicas_changed(self, served: ReplicaSet) -> None:
        """Record the entity's replicas in the registry (in the background; the newest list wins)."""
        task = asyncio.get_running_loop().create_task(self._record(served))
        self._record_tasks.add(task)
        task.add_done_callback(self._record_tasks.discard)

    async def _record(self, served: ReplicaSet) -> None:
        key = (served.endpoint, served.name, served.model_uri)
        async with self._recording.setdefault(key, asyncio.Lock()):
            rows = [ReplicaRow(host=r.host, port=r.port, pid=r.pid, endpoint=served.endpoint, entity=served.name,
                               model_uri=served.model_uri, backend="local", started_at=r.started_at,
                               owner_pid=os.getpid())
                    for r in served.replicas]
            try:
                await run_in_threadpool(self.registry.replace, *key, os.getpid(), rows)
            except Exception as exc:  # noqa: BLE001 - serving goes on; a restart then adopts fewer replicas
                log.warning("replica registry not updated for %s/%s: %s", served.endpoint, served.name, type(exc).__name__)

    async def shutdown(self) -> None:
        rollouts = list(self._tasks.values())
        for task in rollouts:
            task.cancel()
        # wait for each cancelled rollout to stop the replicas it started: the loop ends after this returns,
        # and a rollout never resumed would leave a replica still loading its model behind (an orphan)
        await asyncio.gather(*rollouts, return_exceptions=True)
        entities = [e for live in self.live.values() for e in live.entities.values()]
        self.live.clear()
        await self._stop_all(entities, cancel_starts=True)
        await asyncio.gather(*self._record_tasks, return_exceptions=True)  # the registry says: none left
        await self.backend.close()
        await self.replica_client.close()

    async def wait_settled(self, name: str) -> None:
        task = self._tasks.get(name)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    # ---- data plane ----------------------------------------------------------------------------
    async def served(self, name: str) -> LiveEndpoint:
        """The live endpoint; one being restored after a gateway restart is waited for (up to the request
        timeout), one being created is a 503 at once, as Databricks answers for an endpoint not ready."""
        live = self.live.get(name)
        if live is not None:
            return live
        restoring = self._restoring.get(name)
        if restoring is not None:
            try:
                await asyncio.wait_for(restoring.wait(), self.request_timeout_s)
            except TimeoutError:
                raise unavailable(f"endpoint {name} is still starting after a gateway restart; retry shortly") from None
            live = self.live.get(name)
            if live is not None:
                return live
        if name in self._tasks or restoring is not None:
            raise unavailable(f"endpoint {name} is not ready yet")
        raise not_found(f"endpoint {name} does not exist")

    def entity(self, endpoint: str, name: str) -> ReplicaSet | None:
        """The live served entity ``name`` of ``endpoint`` (None once it has left the routing)."""
        live = self.live.get(endpoint)
        return live.entities.get(name) if live is not None else None

    # ---- internals -----------------------------------------------------------------------------
    async def _resolved(self, config: spec.EndpointCoreConfig) -> spec.EndpointCoreConfig:
        for entity in config.served_entities:
            entity.resolved_version = await run_in_threadpool(
                self._resolve, entity.entity_name, entity.entity_version, entity.entity_alias
            )
        return config

    def _spawn(self, name: str, coro) -> None:  # type: ignore[no-untyped-def]
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks[name] = task
        task.add_done_callback(lambda t, n=name: self._tasks.pop(n, None) if self._tasks.get(n) is t else None)

    async def _deploy(self, name: str, config: spec.EndpointCoreConfig, version: int,
                      left: Mapping[tuple[str, str, str], list[ReplicaRow]] | None = None) -> None:
        try:
            await self._roll_out(name, config, version, left or {})
        finally:
            restoring = self._restoring.pop(name, None)
            if restoring is not None:
                restoring.set()  # requests waiting for the restored endpoint go on (or get 503 if it failed)

    async def _roll_out(self, name: str, config: spec.EndpointCoreConfig, version: int,
                        left: Mapping[tuple[str, str, str], list[ReplicaRow]]) -> None:
        old = self.live.get(name)
        keep: dict[str, ReplicaSet] = {}
        started: list[ReplicaSet] = []
        try:
            for entity in config.served_entities:
                limit = entity.max_concurrency or DEFAULT_MAX_CONCURRENCY
                current = old.entities.get(entity.name) if old else None
                if current and (current.model_name, current.version) == (entity.entity_name, entity.resolved_version):
                    current.configure(limit, spec.scaling_config(entity))  # applies at once
                    keep[entity.name] = current
                    continue
                served = ReplicaSet(entity.name, entity.entity_name, str(entity.resolved_version), self.backend,
                                    endpoint=name, max_concurrency=limit, scaling=spec.scaling_config(entity),
                                    on_change=self._replicas_changed)
                served.attach(self.replica_client.send, self.request_timeout_s)
                started.append(served)
                adopted = await self._adopt(served, left.get((name, str(entity.name), served.model_uri), []))
                missing = max(entity.min_replicas or 1, 1) - adopted
                if missing > 0:
                    await served.start(missing, self._ready_timeout_s)
                keep[entity.name] = served
        except (ReplicaStartError, OSError) as exc:
            log.error("rollout of endpoint %s failed: %s", name, exc)
            await self._stop_all(started)
            await self._finish(name, ready=old is not None, update="UPDATE_FAILED", message=str(exc)[:500])
            return
        except asyncio.CancelledError:
            await self._stop_all(started)
            raise
        self.live[name] = LiveEndpoint(keep, spec.traffic_weights(config), cache_for(config))
        if old is not None:
            await self._stop_all([e for n, e in old.entities.items() if keep.get(n) is not e])
        await self._finish(name, ready=True, update="NOT_UPDATING", config=config, config_version=version)

    async def _finish(self, name: str, *, ready: bool, update: str, message: str | None = None,
                      config: spec.EndpointCoreConfig | None = None, config_version: int | None = None) -> None:
        try:
            record = await run_in_threadpool(self.store.get, name)
        except Exception:
            return  # deleted meanwhile
        record.ready = "READY" if ready else "NOT_READY"
        record.config_update = update
        record.pending_config = None
        record.state_message = message
        record.updated_ms = int(time.time() * 1000)
        if config is not None and config_version is not None:
            record.config, record.config_version = config, config_version
        await run_in_threadpool(self.store.put, record)

    async def _stop_all(self, entities: Iterable[ReplicaSet], *, cancel_starts: bool = False) -> None:
        for entity in entities:
            await entity.stop(cancel_starts=cancel_starts)
