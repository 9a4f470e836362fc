"""One small, real world shared by the integration and e2e tests: data, features, a trained model.

Under xdist it is built once, into a template state folder the controller names (``conftest.pytest_configure``):
the first worker that needs it builds it there, in a process of its own (``python -m tests.world TEMPLATE``),
holding the template's lock; each worker that needs it, that one included, then copies the template into its own
state folder (``copy_world``). A run whose tests need no world builds none. The files name their
folder by its absolute path (MLflow's artifact locations, Feast's registry of data sources, SQLite and protobuf
files both), so the copy replaces the template's path with the worker's in every file, byte for byte: both folders
are ``tempfile.mkdtemp`` names of one prefix in one directory, of equal length, so every length field in those
files stays right. A run in one process builds its world in place (``build_world``).
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from serving.settings import Settings

# Long enough for a 7-day warm-up, a training week, a 7-day evaluation slice and a 14-day label horizon.
WORLD_CUSTOMERS = 600
WORLD_MERCHANTS = 100
WORLD_DAYS = 36
MODEL_NAME = "fraud"


@dataclass(frozen=True)
class World:
    settings: Settings
    materialized: dict[str, Any]
    trained: dict[str, Any]

    @property
    def home(self) -> Path:
        return self.settings.home


def build_world() -> World:
    from feature_repo import synthetic
    from flows.materialize import materialize
    from flows.train import train

    settings = Settings.from_environ(os.environ)
    # the data ends today, as a live system's would: features at "now" are inside their TTL
    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=WORLD_DAYS)
    config = synthetic.SyntheticConfig(
        n_customers=WORLD_CUSTOMERS, n_merchants=WORLD_MERCHANTS, days=WORLD_DAYS, seed=11, start=start
    )
    synthetic.write(synthetic.generate(config), settings.data_dir)
    materialized = materialize()
    trained = train(model_name=MODEL_NAME, alias="champion")
    return World(settings, materialized, trained)


RESULT = "world.pickle"  # the template's build result: (materialized, trained)
FAILED = "world.failed"  # the builder's error, when it failed


def build_template(template: Path, environ: dict[str, str], timeout_s: float = 900) -> None:
    """Build the world into ``template`` in a process of its own, with ``environ`` pointed there; once, whichever
    worker asks first (the others wait for it on the template's lock)."""
    with open(template / ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (template / RESULT).exists() or (template / FAILED).exists():
            return
        build = _start_build(template, environ)
        try:
            build.wait(timeout_s)
        finally:
            if build.poll() is None:
                build.kill()
                build.wait()
        if not (template / RESULT).exists() and not (template / FAILED).exists():
            (template / FAILED).write_text(f"the build exited with code {build.returncode}")


def _start_build(template: Path, environ: dict[str, str]) -> subprocess.Popen[bytes]:
    env = {
        **environ,
        "TOLLFREE_HOME": str(template),
        "MLFLOW_TRACKING_URI": f"sqlite:///{template / 'mlflow.db'}",
        "PREFECT_HOME": str(template / "prefect"),
    }
    with open(template.parent / f"{template.name}.log", "wb") as log:  # beside it: the copy takes the whole folder
        return subprocess.Popen(
            [sys.executable, "-m", "tests.world", str(template)],
            cwd=Path(__file__).resolve().parents[1],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def champion_copy(client: Any, model: str, tags: dict[str, str], source_tags: bool = False) -> str:
    """A new version of ``model`` in ``client``'s registry from the world champion's files and run, with ``tags``
    (and the champion's own first, with ``source_tags``), made ``model``'s champion there; its version number."""
    champion = client.get_model_version_by_alias(MODEL_NAME, "champion")
    if not client.search_registered_models(f"name='{model}'"):
        client.create_registered_model(model)
    all_tags = {**(dict(champion.tags) if source_tags else {}), **tags}
    made = client.create_model_version(model, champion.source, run_id=champion.run_id, tags=all_tags)
    client.set_registered_model_alias(model, "champion", str(made.version))
    return str(made.version)


def copy_home(source: Path, home: Path, skip: frozenset[str] = frozenset()) -> None:
    """Every file under ``source`` copied into ``home`` (a path of the same length), with ``source``'s path written
    as ``home``'s inside them (MLflow's and Feast's stores name their own folders); top-level ``skip`` names left."""
    old, new = str(source).encode(), str(home).encode()
    if len(old) != len(new):
        raise RuntimeError(f"{source} and {home} differ in length: a state folder cannot be copied there")
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if relative.parts[0] in skip:
            continue
        target = home / relative
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file() and path.name not in (RESULT, ".lock"):
            data = path.read_bytes()
            target.parent.mkdir(parents=True, exist_ok=True)
            if old in data:
                target.write_bytes(data.replace(old, new))
            else:
                shutil.copyfile(path, target)


def copy_world(template: Path, home: Path) -> World:
    """The template's world, built (``build_template``), copied into ``home`` (see the module's doc)."""
    if not (template / RESULT).exists():
        log = template.parent / f"{template.name}.log"
        tail = log.read_text(errors="replace")[-4000:] if log.exists() else "(no log)"
        raise RuntimeError(f"the test world's build failed:\n{tail}")
    copy_home(template, home)
    old, new = str(template).encode(), str(home).encode()
    materialized, trained = pickle.loads((template / RESULT).read_bytes().replace(old, new))
    return World(Settings.from_environ(os.environ), materialized, trained)


def main(argv: list[str]) -> int:
    """``python -m tests.world TEMPLATE``: build the world there (the environment points at it), then write
    its result, or what failed."""
    from serving.settings import export_defaults
    from tests.prefect_server import wait_ready

    template = Path(argv[0])
    try:
        export_defaults(os.environ)
        wait_ready(os.environ["PREFECT_API_URL"])
        world = build_world()
        partial = template / f"{RESULT}.partial"
        partial.write_bytes(pickle.dumps((world.materialized, world.trained)))
        partial.rename(template / RESULT)  # whole, or not there
    except BaseException as exc:
        (template / FAILED).write_text(f"{type(exc).__name__}: {exc}")
        raise
    return 0


def two_days_of_transactions(world: World, path: Path, columns: list[str]) -> Path:
    """Two days of the world's transactions (two date partitions), from five days before the data's end,
    written to ``path`` with ``columns``: the batch-scoring tests' input."""
    import pandas as pd

    from feature_repo import synthetic

    tx = synthetic.read_transactions(world.settings.data_dir)
    day = tx["event_timestamp"].max().floor("D") - pd.Timedelta(days=5)
    rows = tx[(tx["event_timestamp"] >= day) & (tx["event_timestamp"] < day + pd.Timedelta(days=2))]
    rows[columns].to_parquet(path, index=False)
    return path


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
