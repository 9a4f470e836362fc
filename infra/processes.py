"""The local stack's processes: each started in a process group of its own, marked, and recorded.

A record holds the pid and the process's start time (``/proc/PID/stat``, field 22), so a pid the
kernel has since given to someone else is never taken for ours. Every process the stack starts
carries ``TOLLFREE_STACK_ID`` in its environment, and so does everything they start in turn (replicas,
flow runs): stopping sweeps those up too, even when they left the group or lost their parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MARK = "TOLLFREE_STACK_ID"


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), or None if there is no such process (or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    if fields[0] == "Z":
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcessRecord:
    name: str
    pid: int
    start_ticks: int
    argv: list[str]
    log: str

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.start_ticks

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessRecord:
        return cls(
            name=str(data["name"]),
            pid=int(data["pid"]),
            start_ticks=int(data["start_ticks"]),
            argv=[str(a) for a in data["argv"]],
            log=str(data["log"]),
        )


def spawn(
    name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path, user: str | None = None
) -> ProcessRecord:
    """Start ``argv`` in a new session (its own process group, no controlling terminal), output to ``log_path``;
    as ``user`` when given (we are root)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            cwd=str(cwd),
            start_new_session=True,
            user=user,
        )
    ticks = start_ticks(process.pid)
    if ticks is None:
        process.wait(timeout=5)
        raise RuntimeError(f"{name} exited at once with code {process.returncode}; see {log_path}")
    return ProcessRecord(name=name, pid=process.pid, start_ticks=ticks, argv=list(argv), log=str(log_path))


def marked(stack_id: str) -> list[tuple[int, int]]:
    """(pid, start ticks) of every live process of this user whose environment carries ``MARK=stack_id``."""
    needle = f"{MARK}={stack_id}".encode()
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue  # gone, or not ours
        if needle in environ.split(b"\0"):
            ticks = start_ticks(int(entry.name))
            if ticks is not None:
                found.append((int(entry.name), ticks))
    return found


def _wait_gone(targets: Iterable[tuple[int, int]], timeout_s: float) -> list[tuple[int, int]]:
    pending = list(targets)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.1)
        pending = [(pid, ticks) for pid, ticks in pending if start_ticks(pid) == ticks]
    return pending


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_record(record: ProcessRecord, grace_s: float, first: signal.Signals = signal.SIGTERM) -> bool:
    """SIGTERM (or ``first``) the record's process group, SIGKILL it after ``grace_s``; True if it had to be
    killed."""
    if not record.alive():
        return False
    _signal_group(record.pid, first)  # spawn() made the pid its group's leader
    if not _wait_gone([(record.pid, record.start_ticks)], grace_s):
        return False
    _signal_group(record.pid, signal.SIGKILL)
    _wait_gone([(record.pid, record.start_ticks)], 5.0)
    return True


def stop_records(records: Sequence[ProcessRecord], grace_s: float) -> list[str]:
    """``stop_record`` for several at once (SIGTERM to all, then wait): the names of those killed."""
    live = [r for r in records if r.alive()]
    for record in live:
        _signal_group(record.pid, signal.SIGTERM)
    left = _wait_gone([(r.pid, r.start_ticks) for r in live], grace_s)
    killed = [r for r in live if (r.pid, r.start_ticks) in left]
    for record in killed:
        _signal_group(record.pid, signal.SIGKILL)
    _wait_gone(left, 5.0)
    return [r.name for r in killed]


def stop_pids(targets: Sequence[tuple[int, int]], grace_s: float) -> list[int]:
    """SIGTERM each (pid, start ticks) still alive, SIGKILL the ones left after ``grace_s``; the killed pids."""
    for pid, ticks in targets:
        if start_ticks(pid) == ticks:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    left = _wait_gone(targets, grace_s)
    for pid, _ in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _wait_gone(left, 5.0)
    return [pid for pid, _ in left]
