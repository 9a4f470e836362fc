"""A local replica's owner: the gateway that started or adopted it.

Local replicas run in their own sessions, so a gateway that dies (``kill -9``, a crash) does not take them
with it: the next gateway on the same state adopts the live ones (``POST /adopt {"owner_pid": PID}`` with
the replica token) and serves on at once. One nobody adopts must not live on forever: once its owner is
gone the replica waits ``grace_s`` (``TOLLFREE_REPLICA_ORPHAN_S``, default 60) for an adoption, then stops
itself. A replica that cannot be adopted yet (still loading its model, or a warm-pool standby without one:
no gateway lists it in the replica table) stops at once when its owner dies. The decision is pure
(:class:`OwnerWatch`, clock and liveness check injected); :func:`watch` runs it.
"""

from __future__ import annotations

import hmac
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from serving.protocol.wire import OWNER_ENV

log = logging.getLogger(__name__)

ORPHAN_ENV = "TOLLFREE_REPLICA_ORPHAN_S"
DEFAULT_ORPHAN_S = 60.0


def pid_alive(pid: int) -> bool:
    """The process exists and has not exited. A zombie (a gateway killed, not yet reaped by its parent) has: the
    gateways' lease already counts it gone (``replicas.local.process_running``), and a replica that counted it
    alive would refuse the new leader's adoption, to be neither adopted nor stopped by it."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")  # gone meanwhile; or no /proc here: the signal said it exists
    except (OSError, IndexError):
        return True


class OwnerWatch:
    """Whether the replica has been without an owner for longer than ``grace_s``."""

    def __init__(
        self,
        owner_pid: int,
        grace_s: float,
        *,
        alive: Callable[[int], bool] = pid_alive,
        clock: Callable[[], float] = time.monotonic,
        adoptable: Callable[[], bool] = lambda: True,
    ) -> None:
        self.owner_pid = owner_pid
        self.grace_s = grace_s
        self._alive = alive
        self._adoptable = adoptable
        self._clock = clock
        self._orphaned_at: float | None = None
        self._lock = threading.Lock()

    def adopt(self, owner_pid: int) -> bool:
        """Take ``owner_pid`` as the owner, unless the current one is alive (a replica is never taken from a
        living gateway); False then."""
        with self._lock:
            if owner_pid != self.owner_pid and self._alive(self.owner_pid):
                return False
            self.owner_pid = owner_pid
            self._orphaned_at = None
            return True

    def expired(self) -> bool:
        """Checked every second or so: True once the owner has been gone for ``grace_s``, or at once when it is
        gone and the replica cannot be adopted (no model loaded yet)."""
        with self._lock:
            if self._alive(self.owner_pid):
                self._orphaned_at = None
                return False
            if not self._adoptable():
                log.warning("owner pid %d is gone before this replica could serve: nobody can adopt it", self.owner_pid)
                return True
            now = self._clock()
            if self._orphaned_at is None:
                self._orphaned_at = now
                log.warning("owner pid %d is gone: waiting %.0fs to be adopted", self.owner_pid, self.grace_s)
            return now - self._orphaned_at >= self.grace_s


def first_owner(environ: Any) -> int:
    """The gateway that started us: named in the environment (it may be gone before we look), else our parent."""
    named = str(environ.get(OWNER_ENV) or "")
    return int(named) if named.isdigit() else os.getppid()


def watch(owner: OwnerWatch, interval_s: float = 1.0) -> threading.Thread:
    """Check the owner every ``interval_s`` in a daemon thread; an orphan past its grace stops (SIGTERM to itself)."""

    def run() -> None:
        while True:
            time.sleep(interval_s)
            if owner.expired():
                log.warning("ownerless and not adopted: stopping")
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=run, name="owner-watch", daemon=True)
    thread.start()
    return thread


class Adoptable:
    """ASGI wrapper: ``POST /adopt`` (replica token) hands the replica to a new owner; all else goes to ``app``."""

    def __init__(self, app: Any, owner: OwnerWatch, token: str | None) -> None:
        self.app = app
        self.owner = owner
        self._token = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/adopt" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        status, body = self._adopt(dict(scope["headers"]), await _body(receive))
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})

    def _adopt(self, headers: dict[bytes, bytes], body: bytes) -> tuple[int, bytes]:
        if self._token is not None and not hmac.compare_digest(headers.get(b"authorization", b""), self._token):
            return 401, b'{"error_code":"UNAUTHENTICATED","message":"a valid bearer token is required"}'
        try:
            pid = orjson.loads(body)["owner_pid"]
            assert isinstance(pid, int) and pid > 0
        except Exception:
            return 400, b'{"error_code":"INVALID_PARAMETER_VALUE","message":"body must be {\\"owner_pid\\": PID}"}'
        if not self.owner.adopt(pid):
            return 409, b'{"error_code":"RESOURCE_CONFLICT","message":"the replica\'s owner is alive"}'
        log.info("adopted by owner pid %d", pid)
        return 200, orjson.dumps({"owner_pid": pid})


async def _body(receive: Any) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body") or sum(map(len, chunks)) > 4096:
            return b"".join(chunks)
