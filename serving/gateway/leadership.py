"""Several gateways on one PostgreSQL state store: a lease picks the leader, the others follow.

The leader (the one holding the ``leader`` lease, see ``serving.state.lease``) runs rollouts, the replicas
and the autoscaler, exactly as a lone gateway does, and applies changes other gateways wrote
(``serving.endpoints.reconcile.Reconciler.reconcile``). A follower serves the data plane of every endpoint,
routing to the replicas the replica table lists (``Reconciler.follow``), and writes its control-plane changes to the
store. Each gateway checks every ``interval_s``, and at once when another gateway's write sends a notice
(``serving.state.changes``): renew or take the lease, then reconcile or follow. A leader that
dies stops renewing; another takes over after the lease's TTL, at once when the dead one was on this machine,
and adopts its replicas (``Reconciler.lead``). A graceful stop releases the lease.

A leader that cannot renew (the store down, or out of its reach) leads on only while the lease it last renewed
is surely still its own: from the moment it asked for that renewal, the TTL less one interval. Then it follows,
before another gateway can take the lease over, even while a statement still waits on a cut network (a watchdog
checks every fifth of an interval). Its writes carry the lease's term as a fencing token
(``serving.state.lease.Fence``), so even a leader that has not noticed yet writes nothing once its lease is
another's.

With the embedded SQLite store there is one gateway, always the leader, and none of this runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from serving.endpoints.manager import EndpointManager
from serving.protocol.errors import ApiError
from serving.replicas.local import process_running
from serving.state.changes import ChangeListener
from serving.state.lease import Lease

log = logging.getLogger(__name__)


def holder_id() -> str:
    """This gateway in the lease: host, pid and a random part (a pid may be reused)."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"


def gone_from_this_host(holder: str) -> bool:
    """A holder on this machine whose process is gone: its lease need not be waited out."""
    host, _, rest = holder.partition("/")
    pid = rest.partition("/")[0]
    return host == socket.gethostname() and pid.isdigit() and not process_running(int(pid))


async def _exited(holder: str, timeout_s: float = 5.0) -> None:
    """Wait a little for a previous leader on this machine that released the lease (a graceful stop) to exit:
    its replicas can be adopted only once their owner is gone."""
    host, _, rest = holder.partition("/")
    pid = rest.partition("/")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return
    deadline = asyncio.get_running_loop().time() + timeout_s
    while process_running(int(pid)) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)


class Leadership:
    def __init__(
        self,
        manager: EndpointManager,
        *,
        ttl_s: float = 10.0,
        interval_s: float = 0.5,
        on_role: Callable[[bool], None] = lambda leading: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.manager = manager
        self.on_role = on_role  # told True when this gateway starts leading, False when it stops (its warm pool)
        self.me = holder_id()
        self.lease = Lease(manager.store.database, ttl_s=ttl_s, is_gone=gone_from_this_host)
        self.interval_s = interval_s
        self.clock = clock
        self._valid_until = 0.0  # on ``clock``: until then, the lease this gateway renewed last is surely its own
        self._changed = asyncio.Event()  # a NOTIFY came: step now rather than at the next interval
        self._listener: ChangeListener | None = None
        self._watchdog: asyncio.Task[None] | None = None

    async def _hold(self) -> bool:
        """Take or renew the lease: whether this gateway leads now (see the module's doc for a failed renewal)."""
        asked = self.clock()
        try:
            term = await run_in_threadpool(self.lease.hold, self.me)
        except Exception as exc:
            log.warning("leader lease not renewed: %s", type(exc).__name__)
            return self.manager.leading and self.clock() < self._valid_until
        if term is None or self.clock() >= asked + self.lease.ttl_s - self.interval_s:
            return False  # not held, or the answer took all the renewal's validity: it renews nothing
        self.manager.fence.hold(self.me, term)
        self._valid_until = asked + self.lease.ttl_s - self.interval_s
        return True

    def expired(self) -> bool:
        """Whether this gateway leads past the validity of the lease it renewed last."""
        return self.manager.leading and self.clock() >= self._valid_until

    def _step_down(self) -> None:
        log.warning("lost the leader lease (or could not renew it in time): following")
        self.manager.leading = False
        self.manager.fence.drop()
        self.on_role(False)

    async def _watch(self) -> None:
        """Step down the moment the lease renewed last may be another's, whatever the step is waiting for: on a
        cut network a renewal, or any other statement, waits unanswered for seconds before it fails."""
        while True:
            await asyncio.sleep(self.interval_s / 5)
            if self.expired():
                self._step_down()

    async def start(self) -> None:
        """At gateway start: lead (bring every endpoint up, adopting what a dead leader left) or follow."""
        if await self._hold():
            log.info("leading (%s)", self.me)
            await self.manager.reconciler.restore()
        else:
            self.manager.leading = False
            self.manager.fence.drop()
            log.info("following the leader")
            await self.manager.reconciler.follow()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()

        def changed() -> None:  # on the listener's thread: wake this loop
            loop.call_soon_threadsafe(self._changed.set)

        self._listener = ChangeListener(self.manager.store.database.url, changed)
        self._listener.start()
        self._watchdog = asyncio.create_task(self._watch())
        while True:
            try:
                # not asyncio.wait_for: on Python 3.11 it can swallow the task's cancellation when the change
                # arrives at the same moment (the gateway's shutdown then waits on this loop forever)
                async with asyncio.timeout(self.interval_s):
                    await self._changed.wait()
            except TimeoutError:
                pass
            self._changed.clear()
            try:
                await self.step()
            except ApiError as exc:  # the state store unreachable: try again next time
                log.warning("leadership step failed: %s", exc.message)
            except Exception:  # the loop must outlive a bad step
                log.exception("leadership step failed")

    async def step(self) -> None:
        before = None
        if not self.manager.leading:
            try:
                before = await run_in_threadpool(self.lease.holder)
            except Exception as exc:  # the store out of reach: the renewal below fails too, and this gateway follows
                log.warning("leader lease not read: %s", type(exc).__name__)
        held = await self._hold()
        if held and not self.manager.leading:
            log.warning("taking over as leader (%s)", self.me)
            if before is not None and before[0] != self.me:
                await _exited(before[0])
            await self.manager.reconciler.lead()
            self.on_role(True)
        elif not held and self.manager.leading:
            self._step_down()
        if self.manager.leading:
            await self.manager.reconciler.reconcile()
        else:
            await self.manager.reconciler.follow()

    async def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        if self._listener is not None:
            await run_in_threadpool(self._listener.stop)
        try:
            await run_in_threadpool(self.lease.release, self.me)
        except Exception as exc:
            log.warning("leader lease not released: %s", type(exc).__name__)
