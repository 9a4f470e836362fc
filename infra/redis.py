"""A redis-server of our own: the broker of stream inputs for the local stack, the tests and the benchmarks.

Debian's ``redis-server`` (installed when missing, ``infra.packages``) on 127.0.0.1, in the foreground, with
its data in a folder of its own. With ``persistent`` (the stack's and the broker tests' setting) every write
is appended to an append-only file, flushed to disk every second (``appendfsync everysec``, Redis' default
for AOF), and a stop by SIGTERM writes the rest before the process ends: a restarted server has every
stream entry, consumer group, pending entry and delivery marker it had.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.packages import ensure_binary


def redis_command(port: int, folder: Path, *, persistent: bool = True) -> list[str]:
    """What runs the server in the foreground on 127.0.0.1:``port`` with its files in ``folder``."""
    durable = (
        ["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""]
        if persistent
        else ["--appendonly", "no", "--save", ""]
    )
    return [
        ensure_binary("redis-server", "redis-server"),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(folder),
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        "--protected-mode",
        "yes",
        *durable,
    ]


def answers(port: int, timeout_s: float = 0.5) -> bool:
    """The server on ``port`` answers PING (and has loaded its data: a loading server answers -LOADING)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as conn:
            conn.sendall(b"PING\r\n")
            return conn.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """One redis-server process; ``stop`` then ``start`` keeps its port and data (a restart)."""

    port: int
    folder: Path
    persistent: bool = True
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            redis_command(self.port, self.folder, persistent=self.persistent),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self.process.returncode} (port {self.port})")
            if answers(self.port):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {timeout_s:.0f} s (port {self.port})")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM: the server writes what it has not yet written to disk, then exits; SIGKILL after ``timeout_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
