"""The peer servers' processes (benchmarks/peer_servers.py): environment, start and wait, and a stop that
leaves nothing of the process tree behind (found from /proc, pids checked against their start time), plus the
model-calling code the peers' scripts share."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.serving_servers import Server, wait_http_ok

READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
BATCH_SIZE, BATCH_WAIT_S = 32, 0.002
_TELEMETRY_OFF = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "BENTOML_DO_NOT_TRACK": "true",
    "DO_NOT_TRACK": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}

# shared by the scripts that run the model themselves (bentoml, rayserve, kserve)
ROWS_CODE = '''
import joblib
import numpy as np
import pandas as pd


def to_x(rows):
    """records -> DataFrame (column names matter to a ColumnTransformer), numeric rows -> float array"""
    if rows and isinstance(rows[0], dict):
        return pd.DataFrame.from_records(rows)
    return np.asarray(rows, dtype=np.float64)


def predict_rows(model, rows):
    return model.predict(to_x(rows)).tolist()


def predict_batches(model, batches):
    """one predict over several requests' rows (all records or all numeric), split back per request"""
    if len({bool(b) and isinstance(b[0], dict) for b in batches}) > 1:
        return [predict_rows(model, b) for b in batches]
    labels = predict_rows(model, [row for b in batches for row in b])
    out, at = [], 0
    for b in batches:
        out.append(labels[at:at + len(b)])
        at += len(b)
    return out
'''


# ---------------------------------------------------------------------------------------------- process tree


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, session id, start time) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                table[int(entry.name)] = (int(fields[1]), int(fields[3]), fields[19])
    return table


def _tree(root: int) -> dict[int, str]:
    """The root's descendants and the members of its session (pid -> start time), the root excluded. Both:
    BentoML's circus setsid()s its workers, and orphans of a killed parent leave the tree but not the session."""
    table, found = _processes(), {root}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = [root, *(pid for pid, (_, sid, _) in table.items() if sid == root)]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += [child for child in children.get(pid, []) if child not in found]
    return {pid: table[pid][2] for pid in found - {root} if pid in table}


def _kill_left(seen: dict[int, str]) -> None:
    """SIGKILL the processes seen in the tree that still run (same pid and start time: not a reused pid)."""
    table = _processes()
    for pid, started in seen.items():
        if pid in table and table[pid][2] == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _stopper(process: subprocess.Popen, cleanup: Callable[[], None] | None, term_root_only: bool) -> Callable[[], None]:
    def stop() -> None:
        seen = _tree(process.pid)
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # its own session: the root and the children it keeps
                (os.kill if term_root_only else os.killpg)(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=STOP_TIMEOUT_S)
        seen.update(_tree(process.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=5)
        _kill_left(seen)
        if cleanup is not None:
            cleanup()

    return stop


def _env(python: Path, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv = python.parent.parent
    env.update(
        _TELEMETRY_OFF,
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        BENTOML_HOME=str(workdir / "bentoml_home"),
        PYTHONUNBUFFERED="1",
    )
    return env


def _wait_log(log_path: Path, offset: int, needle: str, count: int, process: subprocess.Popen) -> None:
    """Wait until the log (past `offset`) says `needle` `count` times: every worker up, not just the first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path, "rb") as log:
            log.seek(offset)
            if log.read().decode(errors="replace").count(needle) >= count:
                return
        if process.poll() is not None:
            raise RuntimeError(f"server exited with code {process.returncode}; see {log_path}")
        time.sleep(0.2)
    raise RuntimeError(f"{needle!r} not seen {count} times after {READY_TIMEOUT_S:.0f}s; see {log_path}")


def start_process(
    kind: str,
    cmd: list[str],
    python: Path,
    workdir: Path,
    logs: Path,
    url: str,
    ready_path: str,
    path: str,
    cleanup: Callable[[], None] | None = None,
    ready_log: tuple[str, int] | None = None,
    term_root_only: bool = False,
) -> Server:
    """Start `cmd` as its own session in workdir, wait for GET url+ready_path to answer 200 (and the log to
    show every worker started), return the Server."""
    logs.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{kind}.log"
    offset = log_path.stat().st_size if log_path.exists() else 0
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=_env(python, workdir),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    stop = _stopper(process, cleanup, term_root_only)
    try:
        wait_http_ok(url + ready_path, process, log_path, READY_TIMEOUT_S)
        if ready_log is not None:
            _wait_log(log_path, offset, *ready_log, process)
    except BaseException:
        stop()
        raise
    return Server(kind, url, path, {"Content-Type": "application/json"}, process.pid, stop)


def loopback_port() -> int:
    from serving.replicas.local import free_port

    return free_port("127.0.0.1")
