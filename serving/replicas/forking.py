"""The gateway's fork server: one process with the replica runtime imported that forks its local replicas
(``replica.fork_server`` says why and how), so each start after the first pays for its model, not for the
imports (about 4.7 CPU-seconds a replica on the 2-core machine).

Started on the first replica start, with the environment the gateway's replicas get. It is asked over its own
stdin and stdout pipes only: it listens on no port and no path, so nothing but its gateway can have it fork.
One that died is replaced at the next start (once per start); when one cannot start, starts fall back to a
``python -m serving.replica_server`` process of their own (``local.start_replica``) from then on, and the log says so.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serving.protocol.wire import OWNER_ENV
from serving.settings import PROJECT_DIR

log = logging.getLogger(__name__)


class ForkServer:
    def __init__(self, env: Mapping[str, str], log_dir: Path, ready_timeout_s: float = 120.0) -> None:
        self._env = dict(env)
        self._log_dir = log_dir
        self._ready_timeout_s = ready_timeout_s
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._failed = False  # it could not start: every start spawns from here on
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def ensure_started(self) -> bool:
        """Start it and wait until its imports are done (blocking: seconds the first time; run it off the
        event loop). False when it cannot be used (it failed to start, or was closed)."""
        with self._lock:
            return self._running()

    def fork(self, args: list[str], log_path: Path) -> int | None:
        """The pid of a replica forked with ``args`` (those of ``python -m serving.replica_server``) and its output
        appended to ``log_path``; None when the fork server cannot fork one (start it another way)."""
        with self._lock:
            for _ in range(2):  # one that died since the last start is replaced once
                if not self._running():
                    return None
                answer = self._ask({"args": args, "log": str(log_path)})
                if answer is not None:
                    break
                self._wait_exited()
        if answer is None or "pid" not in answer:
            log.warning(
                "the fork server did not fork a replica (%s): starting one on its own",
                "it died" if answer is None else answer.get("error"),
            )
            return None
        return int(answer["pid"])

    def close(self, timeout_s: float = 10.0) -> None:
        """End it (its replicas live on: the gateway stops those it must itself)."""
        with self._lock:
            self._closed = True
            process, self._process = self._process, None
        if process is None:
            return
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def _running(self) -> bool:
        """Under the lock: whether it runs and is ready, starting it if it never ran or has died."""
        if self._closed or self._failed:
            return False
        if self._process is not None and self._process.poll() is None:
            return True
        if self._process is not None:
            log.warning(
                "the fork server (pid %d) exited with code %s: starting another",
                self._process.pid,
                self._process.returncode,
            )
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_dir / "fork-server.log", "ab") as out:
            self._process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "serving.replica_server.fork_server",
                    " " * 2048,
                ],  # room for its children's titles
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=out,
                env={**self._env, OWNER_ENV: str(os.getpid())},  # its replicas' owner: this gateway
                cwd=str(PROJECT_DIR),
                start_new_session=True,
            )
        ready = self._read(self._ready_timeout_s)
        if ready is None or not ready.get("ready"):
            log.warning(
                "the fork server did not start (see %s): replicas start on their own", self._log_dir / "fork-server.log"
            )
            self._failed = True
            self._process.kill()
            self._process.wait(timeout=5)
            return False
        log.info("fork server pid %d ready", self._process.pid)
        return True

    def _wait_exited(self, timeout_s: float = 10.0) -> None:
        """Under the lock: wait for a fork server that closed its pipe to be gone, so ``_running`` replaces it (a
        killed process with threads ends some time after its pipe does)."""
        assert self._process is not None
        try:
            self._process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._process.kill()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any] | None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
        except OSError:
            return None
        return self._read(self._ready_timeout_s)

    def _read(self, timeout_s: float) -> dict[str, Any] | None:
        """Its next answer line; None if it ended, or said nothing within ``timeout_s`` (then it is killed)."""
        process = self._process
        assert process is not None and process.stdout is not None, "the fork server is started first"
        timer = threading.Timer(timeout_s, process.kill)  # a hung fork server must not hang the gateway
        timer.start()
        try:
            line = process.stdout.readline()
        finally:
            timer.cancel()
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None
