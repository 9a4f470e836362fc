"""Where a batch run's output lives, and how it is published in one atomic step.

Layout under the output root::

    OUTPUT/run=<run id>/version=<model version>/date=<YYYY-MM-DD>/part-<chunk>.parquet
    OUTPUT/run=<run id>/_SUCCESS                 (JSON manifest: run, model, files, row counts)
    OUTPUT/.run=<run id>.<uuid>.staging/         (hidden: a run being written, or a killed one)

A run is one directory, ``run=<id>``, so publishing it is one rename: the run is written complete
into a hidden staging directory beside it (same filesystem), then renamed into place. When the
run id was published before, the two directories are swapped atomically with Linux's
``renameat2(RENAME_EXCHANGE)``: a reader sees the old run or the new one, never neither and never
a mix; the old one, now in the staging path, is then deleted. Every file of a run carries
``run_id`` and ``model_version`` columns; the directory keys are ``run=`` and ``version=`` (not the
column names) so that hive-partitioned readers (pandas, pyarrow, DuckDB, Spark) can read the root
without a name clash. Readers skip names starting with ``.`` or ``_`` by default, so staging
directories and the manifest are invisible to them.

A run killed midway leaves only its hidden staging directory; the next run of the same id deletes
it. Two concurrent runs with the same id are not supported (the later publish wins).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "_SUCCESS"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def check_run_id(run_id: str) -> str:
    """A run id is one path segment: letters, digits, ``-``, ``_``, ``.``; at most 128 characters."""
    if not run_id or len(run_id) > 128 or not set(run_id) <= _RUN_ID_CHARS or run_id.startswith("."):
        raise ValueError(
            "run id must be 1-128 characters of letters, digits, '-', '_' or '.', not starting with '.'; "
            f"got {run_id[:130]!r}"
        )
    return run_id


def run_dir(output_root: Path, run_id: str) -> Path:
    return Path(output_root) / f"run={run_id}"


def part_path(run_root: Path, model_version: str, date: str, chunk_index: int) -> Path:
    """The file of one chunk's rows for one date, relative names identical for every engine."""
    return run_root / f"version={model_version}" / f"date={date}" / f"part-{chunk_index:06d}.parquet"


def _staging_prefix(run_id: str) -> str:
    return f".run={run_id}."


def new_staging(output_root: Path, run_id: str) -> Path:
    """A fresh hidden directory beside the run's final place; leftovers of killed runs of this id go first."""
    root = Path(output_root)
    root.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(root, run_id)
    staging = root / f"{_staging_prefix(run_id)}{uuid.uuid4().hex[:12]}.staging"
    staging.mkdir()
    return staging


def discard(staging: Path, created_root: Path | None = None) -> None:
    """A failed run's cleanup: its staging directory, and the output root it created if nothing else is in it
    now (a refused run leaves no trace)."""
    shutil.rmtree(staging, ignore_errors=True)
    if created_root is not None:
        with contextlib.suppress(OSError):  # not empty: another run wrote there meanwhile
            created_root.rmdir()


@contextlib.contextmanager
def staged(output_root: Path, run_id: str) -> Iterator[Path]:
    """A new staging directory for the run, published as ``run=ID/`` when the block ends; when the block or the
    publish raises, discarded with the output root if this run created it (see ``discard``)."""
    created_root = not output_root.exists()
    staging = new_staging(output_root, run_id)
    try:
        yield staging
        publish(staging, run_dir(output_root, run_id))
    except BaseException:
        discard(staging, output_root if created_root else None)
        raise


def remove_stale_staging(output_root: Path, run_id: str) -> list[Path]:
    """Delete hidden staging directories of ``run_id`` only (a killed run's, or a swapped-out old run)."""
    removed = []
    prefix = _staging_prefix(run_id)
    for entry in Path(output_root).iterdir():
        if entry.name.startswith(prefix) and entry.name.endswith(".staging") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    if removed:
        log.info("removed %d leftover staging dir(s) of run %s", len(removed), run_id)
    return removed


def write_manifest(staging: Path, manifest: Mapping[str, Any]) -> Path:
    path = staging / MANIFEST
    path.write_text(json.dumps(dict(manifest), indent=2, sort_keys=True, default=str))
    return path


def read_manifest(run_root: Path) -> dict[str, Any]:
    return json.loads((Path(run_root) / MANIFEST).read_text())


def publish(staging: Path, final: Path) -> None:
    """Move a complete staging directory to ``final`` in one step, replacing an earlier run atomically."""
    _fsync_tree(staging)
    if not final.exists():
        try:
            os.rename(staging, final)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            # another publish of the same run id got there between the check and the rename
            _exchange(staging, final)
    else:
        _exchange(staging, final)
    _fsync_dir(final.parent)
    shutil.rmtree(staging, ignore_errors=True)  # holds the replaced run after an exchange


def _exchange(a: Path, b: Path) -> None:
    """Swap two directories atomically (Linux renameat2 RENAME_EXCHANGE)."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(
            errno.ENOSYS, "renameat2 is not available: replacing a published run needs Linux with glibc >= 2.28"
        )
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"atomic exchange of {a} and {b} failed: {os.strerror(err)}")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Directory entries of the staged run on disk before it becomes visible (files are fsynced by their writer)."""
    for dirpath, _, _ in os.walk(root):
        _fsync_dir(Path(dirpath))
