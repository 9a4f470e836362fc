"""What several benchmarks share: progress lines, a nearest-rank percentile, where a result came from, and the
fraud world the soaks serve (the real flows' synthetic data, features and champion)."""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    """A progress line on stderr (stdout is kept for the result)."""
    print(message, file=sys.stderr, flush=True)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank: the smallest value with at least q % of the values at or below it."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered) - 1e-9) - 1))] if ordered else math.nan


def commit(watched: Sequence[str] = ()) -> str:
    """The checkout's short commit, saying so when the ``watched`` paths (what the result measures) are edited."""
    found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=PROJECT, capture_output=True, text=True)
    dirty = ""
    if watched:
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", *watched], cwd=PROJECT, capture_output=True, text=True
        ).stdout.strip()
    return found.stdout.strip() + (f" + uncommitted changes to {', '.join(watched)}" if dirty else "")


class Provenance:
    """Where a result came from: the command, the UTC date, the commit and the machine's load around the run.

    Started before the measured work (the load average before, the wall clock), ``record()`` after it: the
    keys every benchmark's JSON result carries, so the docs' tables can name the run they show.
    """

    def __init__(self, module: str, argv: Sequence[str] | None, watched: Sequence[str] = ()) -> None:
        self.command = " ".join(["python", "-m", module, *(sys.argv[1:] if argv is None else argv)])
        self.date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        self.commit = commit(watched)
        self.loadavg_before = os.getloadavg()
        self.started = time.perf_counter()

    def record(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "date": self.date,
            "commit": self.commit,
            "seconds": round(time.perf_counter() - self.started, 1),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in self.loadavg_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }


def build_fraud_world(home: Path) -> None:
    """The synthetic world in ``home`` (``TOLLFREE_HOME`` must name it): 36 days of raw events, the features
    materialized, ``fraud@champion`` trained and registered, all by the project's own flows."""
    from feature_repo import synthetic
    from flows.materialize import materialize
    from flows.train import train

    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=36)
    config = synthetic.SyntheticConfig(n_customers=600, n_merchants=100, days=36, seed=11, start=start)
    synthetic.write(synthetic.generate(config), home / "data")
    materialize()
    train(model_name="fraud", alias="champion")


def fraud_body(home: Path, rows: int) -> bytes:
    """A scoring request of ``rows`` transactions of the world in ``home`` (the same sample every call)."""
    from feature_repo import synthetic

    tx = synthetic.read_transactions(home / "data")
    picked = tx.sample(rows, random_state=21)[["customer_id", "merchant_id", "amount"]]
    return json.dumps({"dataframe_records": picked.to_dict(orient="records")}).encode()
