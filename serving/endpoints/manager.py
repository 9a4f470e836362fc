"""The control plane's live state: endpoints and the replica set of each served entity.

Records persist in the EndpointStore; replicas are local processes, each listed in the replica registry
while it serves, or the pods of a Deployment per served entity on Kubernetes (``endpoints.placement``).
A config change starts the new served entities' replicas, waits until they are ready, and only then
moves traffic to them; a failed rollout ends UPDATE_FAILED and the old config keeps serving. An endpoint's
rollouts run one at a time, each from what the one before left live. A gateway
that starts on existing state adopts the live replicas a crashed predecessor left (registry, then health
check, then ``/adopt``), starts only what is missing, and stops the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool

from serving.endpoints import spec, validation
from serving.endpoints.live import LiveEndpoint, external_models, stream_inputs
from serving.endpoints.placement import Placement
from serving.endpoints.replica_book import ReplicaBook
from serving.endpoints.resolver import VersionResolver
from serving.endpoints.scaling import scaling_config
from serving.endpoints.store import EndpointStore
from serving.generative.ai_gateway import AiGatewayConfig, ai_gateway_view, parse_ai_gateway
from serving.generative.secrets import SecretMissing, Secrets
from serving.protocol.errors import conflict, invalid_parameter, not_found, unavailable
from serving.replicas.local import Launcher, ReplicaStartError
from serving.replicas.local_backend import LocalBackend
from serving.replicas.remote import RemoteReplica
from serving.replicas.replica_set import DEFAULT_MAX_CONCURRENCY, ReplicaSet
from serving.state.replica_registry import ReplicaRegistry, ReplicaRow

if TYPE_CHECKING:
    from serving.replicas.cluster.connect import Cluster

log = logging.getLogger(__name__)


def superseded(record: spec.EndpointRecord, version: int) -> bool:
    """The record waits for a config later than ``version`` (a change written while that rollout ran): its
    outcome is not the endpoint's. Ending the update there would say READY for a config nobody serves yet."""
    return (
        record.config_update == "IN_PROGRESS" and record.pending_config is not None and version <= record.config_version
    )


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
        cluster: Cluster | None = None,  # replicas as Kubernetes pods (TOLLFREE_BACKEND=kubernetes)
    ) -> None:
        self.store = store
        self._resolve = resolver
        self._home = home or log_dir.parent
        self.launcher = Launcher.for_gateway(replica_env, log_dir, token_file=self._home / "replica.token")
        self.book = ReplicaBook(ReplicaRegistry(store.database), self.launcher)
        self.backend = LocalBackend(self.launcher)  # its warm pool comes with the autoscaler (gateway.app)
        self.cluster = cluster
        self.placement = Placement(self.backend, self.book, cluster)
        if replica_client is None:
            from serving.replicas.client import ReplicaClient

            replica_client = ReplicaClient(self.launcher.token)
        self.replica_client = replica_client
        self.request_timeout_s = request_timeout_s
        self._ready_timeout_s = ready_timeout_s
        self.live: dict[str, LiveEndpoint] = {}
        self.ai_gateways: dict[str, AiGatewayConfig] = {}  # each endpoint's, as its record has it
        self.secrets = Secrets(self._home / "secrets")  # external models' API keys
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._restoring: dict[str, asyncio.Event] = {}  # set once the restored endpoint is live (or failed)
        # Several gateways on one store: only the leader runs rollouts, replicas and the autoscaler; the others
        # write their control-plane changes to the store (the leader picks them up) and route to its replicas.
        self.leading = True
        self._closing = False  # the gateway is stopping: a cancelled rollout leaves a cluster's Deployments be

    # ---- control plane -------------------------------------------------------------------------
    async def create(self, request: spec.CreateEndpointRequest, creator: str) -> spec.EndpointRecord:
        name = validation.validate_endpoint_name(request.name)
        config = await self._resolved(self._with_secrets(validation.normalize_config(request.config, name)))
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
        if self.leading:
            self._spawn(name, config, record.config_version)
        return record

    async def update_config(self, name: str, raw: spec.EndpointCoreConfig) -> spec.EndpointRecord:
        record = await run_in_threadpool(self.store.get, name)
        if record.config_update == "IN_PROGRESS":
            # what Databricks answers while an update is in progress: 409, so clients and SDKs treat it as a conflict
            raise conflict(f"endpoint {name} has a config update in progress; retry when it ends")
        config = await self._resolved(
            self._with_secrets(validation.normalize_config(validation.keep_extensions(raw, record.config), name))
        )
        record.pending_config = config
        record.config_update = "IN_PROGRESS"
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.compare_and_set, name, record.config_version, record)
        if self.leading:
            self._spawn(name, config, record.config_version + 1)
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
        """Store the endpoint's AI gateway (``serving.generative.ai_gateway``); it applies to the next request,
        no replica restarts."""
        config = parse_ai_gateway(body)
        record = await run_in_threadpool(self.store.get, name)
        record.ai_gateway = ai_gateway_view(config)
        record.updated_ms = int(time.time() * 1000)
        await run_in_threadpool(self.store.put, record)
        self.ai_gateways[name] = config
        return record.ai_gateway

    def _remember(self, record: spec.EndpointRecord) -> None:
        """The AI gateway an endpoint's record holds, for its requests (records another gateway wrote too)."""
        try:
            self.ai_gateways[record.name] = parse_ai_gateway(record.ai_gateway or {})
        except Exception:
            log.error("endpoint %s: its stored ai_gateway is not valid any more; serving without it", record.name)
            self.ai_gateways[record.name] = AiGatewayConfig()

    def _with_secrets(self, config: spec.EndpointCoreConfig) -> spec.EndpointCoreConfig:
        """400 when an external model's API key names a secret that is not set."""
        for i, entity in enumerate(config.served_entities):
            if entity.external_model is not None:
                try:
                    self.secrets.read(str(entity.external_model.openai_config.openai_api_key))
                except SecretMissing as exc:
                    raise invalid_parameter(
                        f"served_entities[{i}].external_model.openai_config.openai_api_key: {exc}"
                    ) from None
        return config

    async def openapi(self, name: str) -> dict:
        from serving.endpoints.openapi import endpoint_openapi, model_inputs

        record = await run_in_threadpool(self.store.get, name)
        entities = {}
        for entity in spec.registry_entities(record.config):
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
        left = await self.book.left_running(records)
        for record in records:
            self._remember(record)
            record.ready = "NOT_READY"
            record.config_update = "IN_PROGRESS"
            record.pending_config = None
            record.state_message = "the gateway restarted: starting the endpoint's replicas"
            await run_in_threadpool(self.store.put, record)
            self._restoring[record.name] = asyncio.Event()
            self._spawn(record.name, record.config, record.config_version, left)

    # ---- several gateways on one store ---------------------------------------------------------
    async def follow(self) -> None:
        """A follower's data plane, refreshed from the store: every endpoint's config routed to the replicas
        the registry lists for it (run by the leader). Replicas kept across refreshes keep their counts."""
        records = await run_in_threadpool(self.store.list)
        rows = await self.book.routes() if self.cluster is None else {}  # a cluster's sets follow its watch
        for record in records:
            self._remember(record)
            live = self.live.get(record.name)
            entities: dict[str, ReplicaSet] = {}
            for entity in spec.registry_entities(record.config):
                uri = f"models:/{entity.entity_name}/{entity.resolved_version}"
                served = live.entities.get(entity.name) if live is not None else None
                if served is None or served.model_uri != uri or not served.followed:
                    served = self.placement.follow(record.name, entity)
                    served.attach(self.replica_client.send, self.request_timeout_s)
                if self.cluster is None:
                    served.route_to(
                        [RemoteReplica(r.host, r.port, r.pid) for r in rows.get((record.name, entity.name, uri), [])]
                    )
                entities[entity.name] = served
            weights, external = spec.traffic_weights(record.config), external_models(record.config)
            if live is None or (live.entities, live.weights, live.streams, live.external) != (
                entities,
                weights,
                stream_inputs(record.config),
                external,
            ):
                self.live[record.name] = LiveEndpoint.of(entities, record.config)
                if live is not None:
                    self.placement.forget([e for e in live.entities.values() if e not in entities.values()])
        for name in set(self.live) - {r.name for r in records}:
            self.placement.forget(self.live.pop(name).entities.values())

    async def lead(self) -> None:
        """This gateway has become the leader: adopt the replicas the previous leader left (its process is
        gone) and run every endpoint from here on. Requests keep flowing through the followed routing until
        each endpoint's own replica sets replace it.

        An endpoint's current config is taken over (adopted) first, even when a change waits: only a set this
        gateway owns is stopped once the change serves. It leads once the takeovers are under way: a change sent
        through it before then goes to the store, as a follower's does, and ``reconcile`` rolls it out after
        the takeover (started at once, it would leave out the replicas the takeover had yet to adopt)."""
        records = await run_in_threadpool(self.store.list)
        left = await self.book.left_running(records)
        await self.placement.sweep(records)
        for record in records:
            if record.name not in self._tasks:
                self._spawn(record.name, record.config, record.config_version, left)
                if record.config_update == "IN_PROGRESS" and record.pending_config is not None:
                    self._spawn(record.name, record.pending_config, record.config_version + 1)
        self.leading = True

    async def reconcile(self) -> None:
        """The leader applies what other gateways wrote: endpoints created or updated through them (a
        rollout starts), or deleted (their replicas stop)."""
        records = await run_in_threadpool(self.store.list)
        for record in records:
            self._remember(record)
            # in progress and nobody here rolling it out: written by a follower, or by a leader that died in the
            # middle; a failed rollout is UPDATE_FAILED, so it is not retried until the next change
            if record.config_update == "IN_PROGRESS" and record.name not in self._tasks:
                config, version = self._target(record)
                self._spawn(record.name, config, version)
        for name in set(self.live) - {r.name for r in records} - set(self._tasks):
            gone = self.live.pop(name, None)  # a delete through this gateway may have taken it meanwhile
            if gone is not None:
                await self._stop_all(gone.entities.values())

    @staticmethod
    def _target(record: spec.EndpointRecord) -> tuple[spec.EndpointCoreConfig, int]:
        """The config an endpoint should run: its pending one while an update is in progress, else its own."""
        if record.config_update == "IN_PROGRESS" and record.pending_config is not None:
            return record.pending_config, record.config_version + 1
        return record.config, record.config_version

    async def shutdown(self, *, keep_replicas: bool = False) -> None:
        """Stop: rollouts cancelled, then every replica stopped, unless ``keep_replicas`` (one of several
        gateways: the next leader adopts them)."""
        self._closing = True
        rollouts = list(self._tasks.values())
        for task in rollouts:
            task.cancel()
        # wait for each cancelled rollout to stop the replicas it started: the loop ends after this returns,
        # and a rollout never resumed would leave a replica still loading its model behind (an orphan)
        await asyncio.gather(*rollouts, return_exceptions=True)
        entities = [e for live in self.live.values() for e in live.entities.values()]
        self.live.clear()
        if not keep_replicas or self.cluster is not None:  # a cluster's sets stop routing; its Deployments stay
            await self._stop_all(entities, cancel_starts=True)
        await self.book.flush()  # the registry is up to date
        await self.backend.close()
        await run_in_threadpool(self.launcher.close)  # the fork server; the replicas it forked are handled above
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
        for entity in spec.registry_entities(config):
            entity.resolved_version = await run_in_threadpool(
                self._resolve, entity.entity_name, entity.entity_version, entity.entity_alias
            )
        return config

    def _spawn(
        self,
        name: str,
        config: spec.EndpointCoreConfig,
        version: int,
        left: Mapping[tuple[str, str, str], list[ReplicaRow]] | None = None,
    ) -> None:
        """Roll ``config`` out in the background. One rollout at a time per endpoint: one asked for while another
        runs (a change sent while a new leader adopts what it found) waits for it and starts from what it left
        live. Two at once would each stop only the sets live when it began, so the sets of the one that ended
        first would keep running unlisted, and the last to end would decide what serves."""
        previous = self._tasks.get(name)
        task = asyncio.get_running_loop().create_task(self._deploy(name, config, version, left, previous))
        self._tasks[name] = task
        task.add_done_callback(lambda t, n=name: self._tasks.pop(n, None) if self._tasks.get(n) is t else None)

    async def _deploy(
        self,
        name: str,
        config: spec.EndpointCoreConfig,
        version: int,
        left: Mapping[tuple[str, str, str], list[ReplicaRow]] | None = None,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        try:
            if after is not None:  # cancelled with this one (a delete, a shutdown)
                await asyncio.gather(after, return_exceptions=True)
            await self._roll_out(name, config, version, left or {})
        finally:
            restoring = self._restoring.pop(name, None)
            if restoring is not None:
                restoring.set()  # requests waiting for the restored endpoint go on (or get 503 if it failed)

    async def _roll_out(
        self,
        name: str,
        config: spec.EndpointCoreConfig,
        version: int,
        left: Mapping[tuple[str, str, str], list[ReplicaRow]],
    ) -> None:
        old = self.live.get(name)
        keep: dict[str, ReplicaSet] = {}
        started: list[ReplicaSet] = []
        try:
            for entity in spec.registry_entities(config):
                limit = entity.max_concurrency or DEFAULT_MAX_CONCURRENCY
                current = old.entities.get(entity.name) if old else None
                if (
                    current
                    and not current.followed
                    and (current.model_name, current.version) == (entity.entity_name, entity.resolved_version)
                ):
                    current.configure(limit, scaling_config(entity, stored=True))  # applies at once
                    keep[entity.name] = current
                    continue
                served = self.placement.run(name, entity)
                served.attach(self.replica_client.send, self.request_timeout_s)
                started.append(served)
                adopted = await self.book.adopt(served, left.get((name, str(entity.name), served.model_uri), []))
                missing = max(entity.min_replicas or 1, 1) - adopted
                if missing > 0:
                    await served.start(missing, self._ready_timeout_s)
                keep[entity.name] = served
        except (ReplicaStartError, OSError) as exc:
            log.error("rollout of endpoint %s failed: %s", name, exc)
            await self._stop_all(started)
            await self._finish(name, version, ready=old is not None, update="UPDATE_FAILED", message=str(exc)[:500])
            return
        except asyncio.CancelledError:
            await self._stop_all(started, cancel_starts=self._closing)
            raise
        self.live[name] = LiveEndpoint.of(keep, config)
        if old is not None:
            await self._stop_all([e for n, e in old.entities.items() if keep.get(n) is not e])
        await self._finish(name, version, ready=True, update="NOT_UPDATING", config=config)

    async def _finish(
        self,
        name: str,
        version: int,
        *,
        ready: bool,
        update: str,
        message: str | None = None,
        config: spec.EndpointCoreConfig | None = None,
    ) -> None:
        """Write the outcome of the rollout of config ``version`` (``config`` once it serves). Only once the
        registry lists its replicas: a follower that reads READY routes to them at once. Nothing when a change
        written since waits for a later version (:func:`superseded`): that rollout writes the outcome."""
        await self.book.flush()
        try:
            record = await run_in_threadpool(self.store.get, name)
        except Exception:
            return  # deleted meanwhile
        if superseded(record, version):
            return
        record.ready = "READY" if ready else "NOT_READY"
        record.config_update = update
        record.pending_config = None
        record.state_message = message
        record.updated_ms = int(time.time() * 1000)
        if config is not None:
            record.config, record.config_version = config, version
        await run_in_threadpool(self.store.put, record)

    async def _stop_all(self, entities: Iterable[ReplicaSet], *, cancel_starts: bool = False) -> None:
        for entity in entities:
            await entity.stop(cancel_starts=cancel_starts)
