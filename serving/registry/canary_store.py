"""Where a canary keeps its state between runs: a JSON file per endpoint under ``$TOLLFREE_HOME/canary/``,
written atomically, and a lock file beside it that lets one run per endpoint act.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from serving.registry.canary_steps import CanaryState
from serving.settings import Settings


def state_path(settings: Settings, endpoint: str) -> Path:
    return state_file(settings.home, endpoint)


def state_file(home: Path, endpoint: str) -> Path:
    """The endpoint's canary state in the state folder ``home``."""
    return home / "canary" / f"{quote(endpoint, safe='')}.json"


def read_state(home: Path, endpoint: str) -> dict[str, Any] | None:
    """The endpoint's canary state as stored (plain JSON, for the gateway's console and metrics); None when no canary
    ran, or the file is unreadable."""
    try:
        found = json.loads(state_file(home, endpoint).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def load_state(settings: Settings, endpoint: str) -> CanaryState | None:
    path = state_path(settings, endpoint)
    return CanaryState.from_dict(json.loads(path.read_text())) if path.exists() else None


def save_state(settings: Settings, state: CanaryState) -> None:
    path = state_path(settings, state.endpoint)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(state.to_dict(), indent=1, default=str))
    os.replace(tmp, path)


@contextlib.contextmanager
def exclusive(settings: Settings, endpoint: str) -> Iterator[bool]:
    """One canary run per endpoint at a time; yields False if another holds the lock."""
    path = state_path(settings, endpoint).with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
