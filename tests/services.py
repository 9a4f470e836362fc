"""Real services the tests and benchmarks start themselves: redis-server and PostgreSQL from Debian's packages.

Nothing is installed by hand: a missing program is installed with apt-get when we are root (CI, a fresh
machine; ``infra.packages``). It then runs on a free loopback port with persistence off, and stops
with the session.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from infra import haproxy
from infra.packages import ensure_binary, ensure_haproxy, ensure_postgres
from serving.replicas.local import free_port


class ServiceUnavailable(RuntimeError):
    pass


def ensure_redis_server() -> str:
    return ensure_binary("redis-server", "redis-server")


@contextmanager
def redis_server() -> Iterator[str]:
    """A fresh redis-server on 127.0.0.1; yields its Feast connection string ``127.0.0.1:PORT``."""
    binary = ensure_redis_server()
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="tollfree-redis-")
    process = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise ServiceUnavailable(f"redis-server exited with code {process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                time.sleep(0.1)
        else:
            raise ServiceUnavailable("redis-server did not answer PING within 20 s")
        yield f"127.0.0.1:{port}"
    finally:
        _terminate(process)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class Postgres:
    """A PostgreSQL cluster of the tests' own: ``url(db)`` carries the password; ``stop`` and ``start`` keep port
    and data (an outage, then recovery)."""

    port: int
    user: str
    password: str
    bindir: Path
    datadir: Path
    as_user: str | None
    process: subprocess.Popen | None = None
    listen: tuple[str, ...] = ("127.0.0.1",)  # its addresses; clients elsewhere than loopback need a pg_hba line

    def url(self, database: str = "postgres", *, driver: str = "postgresql", host: str = "127.0.0.1") -> str:
        return f"{driver}://{self.user}:{self.password}@{host}:{self.port}/{database}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self, prefix: str = "t") -> str:
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.admin(f'CREATE DATABASE "{name}"')
        return name

    def start(self, timeout_s: float = 30.0) -> None:
        import psycopg

        self.process = subprocess.Popen(
            [
                str(self.bindir / "postgres"),
                "-D",
                str(self.datadir),
                "-p",
                str(self.port),
                "-c",
                f"listen_addresses={','.join(self.listen)}",
                "-c",
                f"unix_socket_directories={self.datadir}",
                "-c",
                "fsync=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=100",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self.as_user,
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise ServiceUnavailable(f"postgres exited with code {self.process.returncode}")
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise ServiceUnavailable(f"postgres did not accept a connection within {timeout_s:.0f} s") from None
                time.sleep(0.1)

    def stop(self, *, kill: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if kill else signal.SIGINT)  # SIGINT: PostgreSQL's fast shutdown
            self.process.wait(timeout=30)


@contextmanager
def postgres_server(listen: tuple[str, ...] = ("127.0.0.1",), clients: str | None = None) -> Iterator[Postgres]:
    """A fresh PostgreSQL cluster on ``listen`` (127.0.0.1) with password auth, run as the ``postgres`` user when
    we are root (PostgreSQL refuses to run as root); removed with its data at the end. ``clients``: a network
    (``10.1.2.0/30``) whose hosts may connect as well as loopback's."""
    bindir = ensure_postgres()
    as_user = "postgres" if os.geteuid() == 0 else None
    workdir = Path(tempfile.mkdtemp(prefix="tollfree-pg-"))
    password = uuid.uuid4().hex
    (workdir / "pw").write_text(password + "\n")
    if as_user:
        shutil.chown(workdir, as_user)
        shutil.chown(workdir / "pw", as_user)
    subprocess.run(
        [
            str(bindir / "initdb"),
            "-D",
            str(workdir / "data"),
            "-U",
            "tollfree",
            f"--pwfile={workdir / 'pw'}",
            "--auth=scram-sha-256",
            "-E",
            "UTF8",
            "--no-sync",
            "--locale=C",
        ],
        check=True,
        capture_output=True,
        timeout=120,
        user=as_user,
    )
    if clients is not None:
        with open(workdir / "data" / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {clients} scram-sha-256\n")
    server = Postgres(free_port(), "tollfree", password, bindir, workdir / "data", as_user, listen=listen)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def haproxy_server(gateway_ports: Sequence[int | str], workdir: Path, backups: Sequence[str] = ()) -> Iterator[str]:
    """HAProxy (Debian's) in front of the gateways on ``gateway_ports`` (and ``backups``: another region's),
    configured as ``make up`` configures it (``infra.haproxy``); yields its URL once it answers ``/healthz`` through
    a gateway."""
    import httpx

    port = free_port()
    cfg = workdir / "haproxy.cfg"
    cfg.write_text(haproxy.config(port, gateway_ports, backups=backups))
    with open(workdir / "haproxy.log", "ab") as log:
        process = subprocess.Popen([ensure_haproxy(), "-f", str(cfg), "-db"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise ServiceUnavailable(
                    f"haproxy exited with code {process.returncode}; see {workdir / 'haproxy.log'}"
                )
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServiceUnavailable("haproxy did not answer /healthz within 30 s")
            time.sleep(0.1)
        yield url
    finally:
        _terminate(process)


def _terminate(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
