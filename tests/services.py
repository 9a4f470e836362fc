"""Real services the tests and benchmarks start themselves: redis-server from Debian's packages.

Nothing is installed by hand: if ``redis-server`` is missing and we are root (CI, a fresh machine),
it is installed with apt-get. It then runs on a free loopback port with persistence off, and stops
with the session.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from serving.replicas.local import free_port


class ServiceUnavailable(RuntimeError):
    pass


def ensure_binary(binary: str, package: str) -> str:
    """Path of ``binary``, installing Debian's ``package`` if it is missing and we may (root)."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() != 0:
        raise ServiceUnavailable(f"{binary} is not installed and installing it needs root (apt-get install {package})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
                   check=True, env=env, capture_output=True, timeout=600)
    found = shutil.which(binary)
    if not found:
        raise ServiceUnavailable(f"apt-get installed {package} but {binary} is not on PATH")
    return found


def ensure_redis_server() -> str:
    return ensure_binary("redis-server", "redis-server")


@contextmanager
def redis_server() -> Iterator[str]:
    """A fresh redis-server on 127.0.0.1; yields its Feast connection string ``127.0.0.1:PORT``."""
    binary = ensure_redis_server()
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="tollfree-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", workdir,
         "--daemonize", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
