"""Replicas as local OS processes (the embedded backend): start, wait until ready, stop.

Each replica is ``python -m serving.replica_server`` on a free loopback port: forked from the gateway's fork server
(``forking``) when it has one, else a process of its own. A replica counts as ready only when its
``/health/ready`` answers, which it does only after its model is loaded and warmed.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serving.protocol.wire import OWNER_ENV, REPLICA_TOKEN_ENV
from serving.replicas.forking import ForkServer
from serving.settings import PROJECT_DIR
from serving.traffic.replica import process_id

# The address a gateway's local replicas listen on and are listed at in the replica table: loopback unless the
# gateway's other gateways reach it over a network (each then routes to the replicas at this address).
REPLICA_HOST_ENV = "TOLLFREE_REPLICA_HOST"

log = logging.getLogger(__name__)


# Ports handed to servers started later come from below the kernel's ephemeral range: a port from that range
# can be taken by any outgoing connection (to PostgreSQL, a replica, a client) between the choice and the server's
# bind, and the server then fails with "address already in use".
LISTEN_PORTS_FROM = 20000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now, for a server about to start: a random one below the ephemeral
    range where the system has room there, else one the kernel picks."""
    try:
        first_ephemeral = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = LISTEN_PORTS_FROM
    for _ in range(64 if first_ephemeral - LISTEN_PORTS_FROM > 1000 else 0):
        port = random.randrange(LISTEN_PORTS_FROM, first_ephemeral)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))  # no SO_REUSEADDR: a port with connections in TIME_WAIT is passed over
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def can_listen_on(host: str) -> bool:
    """Whether this machine has ``host`` (an IPv4 address or name) to listen on."""
    try:
        free_port(host)
    except (OSError, UnicodeError):
        return False
    return True


class ReplicaStartError(RuntimeError):
    """A replica process exited or never became ready."""


class ReplicaOwned(RuntimeError):
    """A replica refused adoption: the gateway that runs it is alive."""


@dataclass
class LocalReplica:
    """A replica process this gateway runs (a ``serving.traffic.replica.Replica``)."""

    model_uri: str
    host: str
    port: int
    process: subprocess.Popen[bytes] | ForeignProcess  # our child, or forked by the fork server, or adopted
    log_path: Path
    outstanding: int = field(default=0)
    started_at: float = field(default_factory=time.time)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def id(self) -> str:
        return process_id(self.host, self.port, self.pid)

    def alive(self) -> bool:
        return self.process.poll() is None


class ForeignProcess:
    """A replica process that is not this gateway's child (its fork server forked it, or it adopted it from a
    crashed gateway): the part of ``Popen`` the gateway uses. Its exit code is not ours to read: ``returncode``
    is -1 once it is gone (the fork server's log has the code of those it forked)."""

    RECHECK_S = 0.05

    def __init__(self, pid: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._clock = clock
        self._checked = float("-inf")

    def poll(self) -> int | None:
        """-1 once the process is gone. /proc is read at most every ``RECHECK_S``: the data plane asks on every
        request whether its replicas are alive, and a read of /proc per request was a third of the gateway's
        CPU at 4,000 requests a second; a replica that died meanwhile refuses its calls, which the
        dispatcher retries on another."""
        if self.returncode is None:
            now = self._clock()
            if now - self._checked >= self.RECHECK_S:
                self._checked = now
                if not process_running(self.pid):
                    self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.05)
        return -1


def process_running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_replica_process(pid: int, port: int) -> bool:
    """``pid`` runs ``serving.replica_server`` on ``port`` (a replica table row may outlive its process, and a pid
    be reused). A forked replica's command line is its process title, one string with spaces
    (``serving.replica_server.fork_server``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            args = cmdline.read().replace(b"\0", b" ").split()
    except OSError:
        return False
    return b"serving.replica_server" in args and b"--port" in args and str(port).encode() in args


def adopt_replica(
    host: str, port: int, pid: int, model_uri: str, token: str | None, log_dir: Path, timeout_s: float = 2.0
) -> tuple[LocalReplica, dict] | None:
    """Take over a live replica a previous gateway started: it must be a replica process on that port, answer
    ready for ``model_uri`` and accept this gateway (its pid) as its owner with the replica token. None if not;
    ReplicaOwned if its owner is alive (it refuses: a replica is never taken from a living gateway)."""
    if not is_replica_process(pid, port):
        return None
    url = f"http://{host}:{port}"
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        ready = httpx.get(f"{url}/health/ready", timeout=timeout_s)
        if ready.status_code != 200 or ready.json().get("model_uri") != model_uri:
            return None
        answer = httpx.post(f"{url}/adopt", json={"owner_pid": os.getpid()}, headers=headers, timeout=timeout_s)
        if answer.status_code == 409:
            raise ReplicaOwned(f"replica pid {pid} on port {port} belongs to a gateway that is alive")
        if answer.status_code != 200:
            return None
    except (httpx.HTTPError, ValueError):
        return None
    replica = LocalReplica(
        model_uri=model_uri, host=host, port=port, process=ForeignProcess(pid), log_path=log_dir / f"replica-{port}.log"
    )
    log.info("adopted replica pid %d for %s on port %d", pid, model_uri, port)
    return replica, ready.json()


def stop_stray(pid: int, port: int) -> None:
    """Stop a replica process nobody needs any more (left by a crashed gateway), if it still is one."""
    if is_replica_process(pid, port):
        stop_replica(LocalReplica("", "127.0.0.1", port, ForeignProcess(pid), Path(os.devnull)))


def replica_token(environ: Mapping[str, str], token_file: Path | None) -> str:
    """``TOLLFREE_REPLICA_TOKEN``; else the state folder's own (``token_file``, created 0600 on first use), so a
    restarted gateway can still talk to the replicas its predecessor left; else a fresh one."""
    if environ.get(REPLICA_TOKEN_ENV):
        return environ[REPLICA_TOKEN_ENV]
    if token_file is None:
        return secrets.token_urlsafe(32)
    try:
        return token_file.read_text().strip() or _new_token(token_file)
    except FileNotFoundError:
        return _new_token(token_file)


def _new_token(token_file: Path) -> str:
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(token)
    return token


@dataclass(frozen=True)
class Launcher:
    """How one gateway starts its replicas: the folder for their logs, the environment they get, and the fork
    server they are forked from (None: each is a process of its own)."""

    log_dir: Path
    env: Mapping[str, str]
    fork_server: ForkServer | None = None
    host: str = "127.0.0.1"  # the address replicas listen on and are listed at (``REPLICA_HOST_ENV``)

    @classmethod
    def for_gateway(cls, environ: Mapping[str, str], log_dir: Path, token_file: Path | None = None) -> Launcher:
        """The gateway's environment for its replicas: never its admin token, always a replica token.

        Replicas accept invocations only with the replica token; it lives in the gateway and their
        environment. Set TOLLFREE_REPLICA_TOKEN (a Kubernetes Secret, say) when replicas run apart from
        the gateway; otherwise it is kept in ``token_file`` (see :func:`replica_token`)."""
        token = replica_token(environ, token_file)
        env = {**{k: v for k, v in environ.items() if k != "TOLLFREE_TOKEN"}, REPLICA_TOKEN_ENV: token}
        return cls(log_dir, env, ForkServer(env, log_dir), environ.get(REPLICA_HOST_ENV) or "127.0.0.1")

    @property
    def token(self) -> str | None:
        return self.env.get(REPLICA_TOKEN_ENV)

    def start(self, model_uri: str) -> LocalReplica:
        """A replica process for ``model_uri`` (empty: a warm-pool standby); see :func:`start_replica`."""
        return start_replica(model_uri, self.log_dir, self.env, host=self.host, fork_server=self.fork_server)

    def prepare(self) -> None:
        """Have the fork server ready (blocking: its imports take seconds the first time), so that ``start``
        returns at once."""
        if self.fork_server is not None:
            self.fork_server.ensure_started()

    def close(self) -> None:
        if self.fork_server is not None:
            self.fork_server.close()

    def activate(self, replica: LocalReplica, model_uri: str) -> dict:
        """Load ``model_uri`` into a standby; see :func:`activate`."""
        return activate(replica, model_uri, self.token)


def rss_mb(pid: int | None) -> float | None:
    """A process's resident memory in MB, from /proc (None if it is gone, or not on this machine: no pid)."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def start_replica(
    model_uri: str,
    log_dir: Path,
    env: Mapping[str, str],
    host: str = "127.0.0.1",
    fork_server: ForkServer | None = None,
) -> LocalReplica:
    """Start one replica process, forked by ``fork_server`` if it can, else spawned; returns at once (use
    ``wait_ready``). A forked one has the fork server's environment (``Launcher`` builds that one from the same
    ``env``), a spawned one ``env``.

    ``model_uri`` empty: a standby replica for the warm pool (``activate`` gives it a model)."""
    port = free_port(host)
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"replica-{port}.log"
    what = ["--model-uri", model_uri] if model_uri else ["--standby"]
    args = [*what, "--host", host, "--port", str(port)]
    pid = fork_server.fork(args, log_path) if fork_server is not None else None
    if pid is not None:
        log.info("forked replica pid %d for %s on port %d", pid, model_uri, port)
        return LocalReplica(model_uri=model_uri, host=host, port=port, process=ForeignProcess(pid), log_path=log_path)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving.replica_server", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, OWNER_ENV: str(os.getpid())},  # the replica outlives us if we crash, and knows it
            cwd=str(PROJECT_DIR),
            start_new_session=True,
        )
    log.info("started replica pid %d for %s on port %d", process.pid, model_uri, port)
    return LocalReplica(model_uri=model_uri, host=host, port=port, process=process, log_path=log_path)


def _exited(replica: LocalReplica) -> str:
    if isinstance(replica.process, ForeignProcess):  # not our child: the fork server's log has its code
        return "exited"
    return f"exited with code {replica.process.returncode}"


def wait_ready(replica: LocalReplica, timeout_s: float = 120.0, poll_s: float = 0.2) -> dict:
    """Block until the replica answers ready and return its ready answer (with its batching plan);
    raise ReplicaStartError if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not replica.alive():
                raise ReplicaStartError(f"replica for {replica.model_uri} {_exited(replica)}; see {replica.log_path}")
            try:
                answer = client.get(f"{replica.url}/health/ready")
                if answer.status_code == 200:
                    return answer.json()
            except httpx.TransportError:
                pass
            time.sleep(poll_s)
    stop_replica(replica)
    raise ReplicaStartError(f"replica for {replica.model_uri} not ready after {timeout_s:.0f}s; see {replica.log_path}")


def wait_live(replica: LocalReplica, timeout_s: float = 120.0, poll_s: float = 0.1) -> None:
    """Block until a (standby) replica answers ``/health/live``."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if not replica.alive():
                raise ReplicaStartError(f"standby replica {_exited(replica)}; see {replica.log_path}")
            try:
                if client.get(f"{replica.url}/health/live").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(poll_s)
    raise ReplicaStartError(f"standby replica not live after {timeout_s:.0f}s; see {replica.log_path}")


def activate(replica: LocalReplica, model_uri: str, token: str | None, timeout_s: float = 120.0) -> dict:
    """Load ``model_uri`` into a standby replica; its ready answer (with the batching plan)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        answer = httpx.post(f"{replica.url}/load", json={"model_uri": model_uri}, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise ReplicaStartError(
            f"standby replica could not load {model_uri}: {type(exc).__name__}; see {replica.log_path}"
        ) from exc
    if answer.status_code != 200:
        raise ReplicaStartError(
            f"standby replica could not load {model_uri} (HTTP {answer.status_code}); see {replica.log_path}"
        )
    replica.model_uri = model_uri
    return answer.json()


def _signal(pid: int, signum: int) -> None:
    """To the replica's process group (it leads one, with whatever it started); to the process alone if it
    does not lead one yet (a forked replica just after its fork)."""
    try:
        os.killpg(pid, signum)
    except ProcessLookupError:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def stop_replica(replica: LocalReplica, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; always reaps the process."""
    if replica.alive():
        _signal(replica.pid, signal.SIGTERM)
        try:
            replica.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(replica.pid, signal.SIGKILL)
            replica.process.wait(timeout=5)
    log.info("stopped replica pid %d (port %d)", replica.pid, replica.port)
