"""Shadow traffic: a share of an endpoint's requests copied to a shadow entity after the client's answer.

A traffic route with ``shadow_percentage`` (and no traffic of its own) makes its served entity a shadow
(``LiveEndpoint.shadows``). After a request's answer has been handed to the client, each shadow draws its share
and, if drawn, gets the same request as a task of its own: the client never waits for it, and nothing the shadow
does (an error, a timeout, slowness) reaches the client's answer. The shadow's answer and latency go to the
inference log under the client's request id, marked ``shadow``, so the canary's shadow phase can pair the two
answers to one request. A copy is not sent, and is counted (``tollfree_shadow_skipped_total`` by reason), when the
gateway already holds ``max_in_flight`` copies, when the shadow's queue is full (its dispatcher would refuse it) or
when the shadow has no replica yet: a slow shadow holds no unbounded backlog and takes no more than it can serve,
and the log's shadow records are the shadow's answers, not refusals for load.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from serving.endpoints.live import LiveEndpoint
from serving.gateway.metrics import GatewayMetrics
from serving.inference_log import InferenceLogWriter, InferenceRecord, utc_now
from serving.protocol.errors import ApiError
from serving.protocol.wire import WireRequest

if TYPE_CHECKING:
    from serving.gateway.data_plane import Reply

log = logging.getLogger(__name__)

MAX_IN_FLIGHT = 256  # copies a gateway holds in flight for its shadows, over every endpoint


# Scores ``request`` on one served entity of the endpoint into the reply (the data plane's ``score_on_entity``).
Score = Callable[[LiveEndpoint, str, str, WireRequest, "Reply"], Awaitable[None]]


class ShadowMirror:
    """Copies requests to an endpoint's shadows; see the module's doc."""

    def __init__(
        self,
        score: Score,
        new_reply: Callable[[], Reply],
        inference_log: InferenceLogWriter,
        metrics: GatewayMetrics,
        rng: random.Random,
        max_in_flight: int = MAX_IN_FLIGHT,
    ) -> None:
        self.score, self.new_reply = score, new_reply
        self.inference_log, self.metrics, self.rng = inference_log, metrics, rng
        self.max_in_flight = max_in_flight
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def mirror(self, live: LiveEndpoint, name: str, request: WireRequest, served_entity: str | None) -> None:
        """After the client's answer: a copy of ``request`` to each shadow of ``live`` that draws it."""
        for shadow, percentage in live.shadows:
            if shadow == served_entity or self.rng.random() * 100 >= percentage:
                continue
            skipped = self._skip(live, shadow)
            if skipped is not None:
                self.metrics.shadow_skipped.labels(name, skipped).inc()
                continue
            task = asyncio.get_running_loop().create_task(self._copy(live, name, shadow, request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _skip(self, live: LiveEndpoint, shadow: str) -> str | None:
        """Why a copy for ``shadow`` is not sent now, or None."""
        if len(self._tasks) >= self.max_in_flight:
            return "in_flight"
        replica_set = live.replica_sets.get(shadow)
        dispatcher = replica_set.dispatcher if replica_set is not None else None
        if dispatcher is None:
            return "not_ready"
        return "busy" if dispatcher.waiting >= dispatcher.queue_limit else None

    async def _copy(self, live: LiveEndpoint, name: str, shadow: str, request: WireRequest) -> None:
        started = time.perf_counter()
        reply = self.new_reply()
        try:
            await self.score(live, name, shadow, request, reply)
        except ApiError as err:
            reply.refused(err)
        except Exception as exc:  # a shadow's failure is its own: logged and recorded, never raised
            log.warning("shadow %s of endpoint %s failed: %s", shadow, name, type(exc).__name__)
            reply.refused(ApiError(500, "INTERNAL_ERROR", "the shadow failed"))
        self.record(name, request.request_id, shadow, reply, time.perf_counter() - started)

    def record(self, name: str, request_id: str, shadow: str, reply: Reply, elapsed: float) -> None:
        answered = reply.answer if reply.answer is not None and reply.status == 200 else None
        self.metrics.shadow_requests.labels(name, shadow, str(reply.status)).inc()
        self.inference_log.record(
            InferenceRecord(
                request_id=request_id,
                timestamp=utc_now(),
                endpoint=name,
                served_entity=shadow,
                model_version=reply.version,
                status_code=reply.status,
                latency_ms=elapsed * 1000,
                inputs=None,  # the client's record of request_id holds them
                served_features=answered.second.decode() if answered is not None and answered.second else None,
                outputs=answered.first.decode() if answered is not None else None,
                error_code=reply.error_code,
                rows=answered.rows if answered is not None else 0,
                shadow=True,
            )
        )

    async def close(self) -> None:
        """Cancel the copies still in flight (the gateway is stopping)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
