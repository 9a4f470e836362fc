"""Resident memory of a model version's local replica processes, read from ``/proc``.

The embedded backend runs replicas as ``python -m serving.replica_server --model-uri models:/NAME/VERSION`` (or forked
with that command line as their title);
this sums ``VmRSS`` over the processes serving that URI. Elsewhere (no ``/proc``, Kubernetes) it
returns None and the canary's memory check stays pending.
"""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def _cmdline(pid_dir: Path) -> list[str]:
    """A process's command line as words (a replica forked by its gateway's fork server has its command line as
    one string, its process title)."""
    try:
        return (pid_dir / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split()
    except OSError:
        return []


def _rss_mb(pid_dir: Path) -> float | None:
    try:
        for line in (pid_dir / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def replica_rss_mb(model: str, version: str, proc: Path = PROC) -> float | None:
    """Total RSS (MB) of the replicas serving ``models:/model/version``; None if none is found."""
    if not proc.is_dir():
        return None
    uri = f"models:/{model}/{version}"
    total, found = 0.0, False
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        args = _cmdline(pid_dir)
        if "serving.replica_server" in args and uri in args:
            rss = _rss_mb(pid_dir)
            if rss is not None:
                total, found = total + rss, True
    return total if found else None
