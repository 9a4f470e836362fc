"""What starts and stops with the gateway app (its ASGI lifespan): the inference log, the endpoints and their
replicas, the Kubernetes watch, leadership among gateways, the autoscaler and its leader's warm pool, the stream
consumers, the scrape targets, the gRPC service and the shadows' copies in flight."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from serving.console.recorder import TimelineRecorder
from serving.endpoints.manager import EndpointManager
from serving.gateway.autoscaling import LiveAutoscaler
from serving.gateway.chat_plane import ChatPlane
from serving.gateway.data_plane import InvocationsHandler
from serving.gateway.leadership import Leadership, holder_id
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.scaling_signals import MachineCpu
from serving.gateway.scrape_targets import ScrapeTargets
from serving.gateway.shared_scaling import SharedScaling
from serving.gateway.streaming import StreamSupervisor
from serving.heap import settle_heap
from serving.inference_log import InferenceLogWriter
from serving.replicas.warm_pool import WarmPool
from serving.state.scaling import LoadBoard, ScalerRecords

if TYPE_CHECKING:  # imported when a gRPC port is asked for: grpcio and the protocol's compiled messages
    from serving.gateway.oip_grpc import GrpcListen

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoscalerSettings:
    warm_pool_size: int  # standby replica processes kept ready
    interval_s: float  # between two autoscaler steps


def lifespan(
    manager: EndpointManager,
    inference_log: InferenceLogWriter,
    metrics: GatewayMetrics,
    autoscaling: AutoscalerSettings | None,
    streams: StreamSupervisor,
    chat: ChatPlane,
    scrape_targets: ScrapeTargets | None,
    grpc: GrpcListen | None,
    data_plane: InvocationsHandler,
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """Start: the inference log, the replica client, every stored endpoint, the autoscaler, the stream
    consumers. Stop: the reverse (the consumers first: what they hold stays pending in the broker), every
    replica stopped and the log flushed before the process ends."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if grpc is not None:
            grpc.bind()  # a gRPC port in use stops the gateway before it starts anything
        inference_log.start()
        await manager.open()
        if manager.cluster is not None:  # the routing first: a restored endpoint finds its pods at once
            await run_in_threadpool(_watch_cluster, manager)
        pool = WarmPoolSwitch(manager, autoscaling.warm_pool_size if autoscaling is not None else 0)
        leadership = None if manager.store.database.is_sqlite else Leadership(manager, on_role=pool.switch)
        if leadership is None:
            await manager.reconciler.restore()
        else:
            await leadership.start()
        shared = None
        tasks = []
        if autoscaling is not None:
            database = manager.store.database
            shared = SharedScaling(
                LoadBoard(database),
                ScalerRecords(database, manager.fence),
                leadership.me if leadership is not None else holder_id(),
                lambda: manager.leading,
            )
            await run_in_threadpool(shared.start)
            pool.switch(manager.leading)  # a follower starts no replica, so needs no standby
            tasks.append(_start_autoscaler(app, manager, metrics, autoscaling, shared, streams))
        tasks.append(asyncio.get_running_loop().create_task(streams.run()))
        if leadership is not None:
            tasks.append(asyncio.get_running_loop().create_task(leadership.run()))
        if scrape_targets is not None:
            tasks.append(asyncio.get_running_loop().create_task(scrape_targets.run()))
        if grpc is not None:
            await grpc.start()
            app.state.grpc_port = grpc.port
        settle_heap()  # what is alive now stays out of the collector's reach: no full collection stalls requests
        try:
            yield
        finally:
            if grpc is not None:
                await grpc.stop()
            await data_plane.shadows.close()  # copies in flight to shadows: no client waits for them
            for task in reversed(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if shared is not None:
                await run_in_threadpool(shared.stop)
            # one of several gateways leaves its replicas to the next leader (they stop themselves if none comes)
            await manager.shutdown(keep_replicas=leadership is not None)
            if leadership is not None:
                await leadership.stop()
            if manager.cluster is not None:
                await run_in_threadpool(manager.cluster.stop)
            await chat.upstreams.close()
            inference_log.close()

    return lifespan


CLUSTER_SYNC_S = 10.0


def _watch_cluster(manager: EndpointManager) -> None:
    """Start the EndpointSlice watch and wait (up to ``CLUSTER_SYNC_S``) for its first list."""
    assert manager.cluster is not None
    manager.cluster.start()
    if not manager.cluster.routes.synced.wait(CLUSTER_SYNC_S):
        log.warning(
            "no EndpointSlice list from the Kubernetes API after %.0f s: starting without routes", CLUSTER_SYNC_S
        )


def _start_autoscaler(
    app: FastAPI,
    manager: EndpointManager,
    metrics: GatewayMetrics,
    settings: AutoscalerSettings,
    shared: SharedScaling,
    streams: StreamSupervisor,
) -> asyncio.Task[None]:
    """The autoscaler over the live replica sets, stepped on this event loop (its scale-ups take standbys from
    the leader's warm pool, ``WarmPoolSwitch``)."""
    loop = asyncio.get_running_loop()
    # local replicas share this machine's cores; a cluster's pods run on nodes the gateway does not see
    machine = MachineCpu() if manager.cluster is None else None
    scaler = LiveAutoscaler(
        manager, interval_s=settings.interval_s, shared=shared, backlog=streams.backlog_per_s, machine=machine
    )
    app.state.autoscaler = scaler
    metrics.registry.register(scaler.controller.collector())
    recorder = TimelineRecorder(app.state.timeline, metrics.server_errors)
    pool = manager.backend.pool
    scaler.after_step = lambda: recorder.record(
        scaler.controller.scalers, pool.idle if pool is not None else 0, time.time()
    )
    return loop.create_task(scaler.run())


class WarmPoolSwitch:
    """The leader's warm pool: standbys kept ready while this gateway leads (it starts the replicas), none
    while it follows; filled and emptied in the background."""

    def __init__(self, manager: EndpointManager, size: int) -> None:
        self.manager = manager
        self.size = size

    def switch(self, leading: bool) -> None:
        backend = self.manager.backend
        loop = asyncio.get_running_loop()
        if leading and self.size and backend.pool is None:
            backend.pool = WarmPool(self.size, self.manager.launcher)
            loop.run_in_executor(None, backend.pool.fill)
        elif not leading and backend.pool is not None:
            pool, backend.pool = backend.pool, None
            loop.run_in_executor(None, pool.close)
