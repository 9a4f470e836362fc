"""Online feature retrieval latency, in process, on SQLite and on Redis, against the raw store.

    python -m benchmarks.features_online [--customers N] [--iterations N] [--json]

Builds a throw-away state folder (synthetic data, feature tables, both online stores materialized;
Redis is a fresh redis-server on 127.0.0.1), then times, for 1 and for 64 entity rows per call:

  feature_service   store.get_online_features(features=<FeatureService fraud_v1>, entity_rows=<columnar
                    dict>).to_dict(): the full FeatureService path, python-mode on-demand view included;
  tollfree_reader   serving.features.reader.OnlineFeatureReader(store, "fraud_v1", fast=False).read(frame):
                    the replica's path through Feast (request validation, the call above, unknown-entity
                    check, model frame);
  tollfree_fast     OnlineFeatureReader(store, "fraud_v1", fast=True).read(frame): what a replica calls by
                    default: the same validation, check and frame, with the online store read directly
                    (serving.features.store_reader) and the on-demand view run through Feast's stored
                    transformation; checked equal to tollfree_reader before timing;
  tollfree_fast_cold  the same with its cache of serialized entity keys emptied before every call: the
                    cost for entities the replica has not seen yet;
  no_odfv_refs      get_online_features with the 9 "view:feature" refs of the two batch views (no
                    on-demand view), same entity rows, then .to_dict(): isolates the on-demand view's cost;
  anchor_raw        the same keys read straight from the store, bytes only (see ANCHORS).

The paths, their inputs and the timing are in benchmarks/features_online_paths.py.

Each path gets the same seeded random rows (ids that exist, amounts drawn from real transactions), one
fresh set per iteration; paths run in interleaved rounds so machine noise spreads over all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Provenance, log
from benchmarks.features_online_paths import (
    BATCH_VIEWS,
    ROUNDS,
    SERVICE,
    Inputs,
    check_paths,
    make_inputs,
    paths_for,
    time_paths,
)

SIZES = (1, 64)
DEFAULT_ITERATIONS = {1: 2000, 64: 500}
DAYS = 36
SEED = 20261
PATHS = ("feature_service", "tollfree_reader", "tollfree_fast", "tollfree_fast_cold", "no_odfv_refs", "anchor_raw")
TARGETS = {1: {"p50_ms": 1.0, "p99_ms": 2.0}, 64: {"p99_ms": 5.0}}
TARGET_PATHS = (
    "feature_service",
    "tollfree_reader",
    "tollfree_fast",
    "tollfree_fast_cold",
)  # the target is set on feature_service; the tollfree_* paths are held to the same budget

ANCHORS = {
    "sqlite": (
        "one sqlite3 connection (no type detection) to Feast's online_store.db; per batch view, the same "
        "statement Feast's SQLite store runs: SELECT entity_key, feature_name, value, event_ts FROM "
        '"tollfree_<view>" WHERE entity_key IN (<unique keys>) ORDER BY entity_key, then fetchall(); '
        "keys pre-serialized (serialize_entity_key v3) outside the timer; values stay protobuf bytes"
    ),
    "redis": (
        "one redis-py client; a single non-transactional pipeline of HGETALL on Feast's key "
        "(serialize_entity_key v3 + b'tollfree') for each unique customer and merchant, then execute(); "
        "keys pre-built outside the timer; values stay protobuf bytes (Feast itself sends HMGET of the "
        "same hash fields)"
    ),
}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.features_online", description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=1000, help="synthetic customers (default 1000)")
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="timed calls per path and batch size (default 2000 for 1 entity, 500 for 64)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.customers < 64:
        parser.error("--customers must be >= 64")
    if args.iterations is not None and args.iterations < ROUNDS:
        parser.error(f"--iterations must be >= {ROUNDS}")
    return args


def _percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


# --- set-up ------------------------------------------------------------------------------------------


def _build_tables(home: Path, customers: int) -> tuple[dict, Any, datetime]:
    from feature_repo import aggregations, synthetic
    from feature_repo import store as feature_store

    start = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=DAYS)
    data = synthetic.generate(synthetic.SyntheticConfig(n_customers=customers, days=DAYS, start=start))
    tables = aggregations.feature_tables(
        data.transactions, data.customers["customer_id"], data.merchants["merchant_id"]
    )
    for name, frame in tables.items():
        feature_store.write_table(home, name, frame)
    return tables, data.transactions, start


def _quiet_warnings() -> None:
    # Feast's on-demand view notice and ibis/duckdb deprecations; some imports reset the filters.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*experimental feature.*")


def _open_and_load(home: Path, choice: Any, start: datetime, end: datetime) -> Any:
    from feature_repo import store as feature_store

    _quiet_warnings()
    store = feature_store.open_store(home, choice)
    feature_store.apply_definitions(store)
    # Feast prints progress on stdout; keep stdout for the result.
    with contextlib.redirect_stdout(sys.stderr):
        store.materialize(start_date=start, end_date=end, feature_views=list(BATCH_VIEWS))
    return store


def _sqlite_tables(db_path: Path, project: str) -> dict[str, str]:
    """Feast's online table for each batch view, found in the SQLite file itself."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        found = {}
        for view in BATCH_VIEWS:
            name = f"{project}_{view}"
            if name not in names:
                raise RuntimeError(f"no online table for {view} in {db_path} (tables: {sorted(names)})")
            columns = [row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')]
            if columns[:3] != ["entity_key", "feature_name", "value"] or "event_ts" not in columns:
                raise RuntimeError(f"unexpected layout of {name}: {columns}")
            found[view] = name
        return found


# --- report ------------------------------------------------------------------------------------------


def _verdict(size: int, p50: float, p99: float) -> tuple[bool, str]:
    target = TARGETS[size]
    ok = p50 <= target.get("p50_ms", float("inf")) and p99 <= target.get("p99_ms", float("inf"))
    text = " & ".join(
        f"{label} <= {target[key]:g} ms" for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")) if key in target
    )
    return ok, text


def _rows(results: dict[tuple[str, int], dict[str, list[int]]]) -> list[dict[str, Any]]:
    rows = []
    for (kind, size), samples in results.items():
        anchor_p50, _ = _percentiles(samples["anchor_raw"])
        for path in PATHS:
            p50, p99 = _percentiles(samples[path])
            row: dict[str, Any] = {
                "store": kind,
                "entities": size,
                "path": path,
                "iterations": len(samples[path]),
                "p50_ms": round(p50, 4),
                "p99_ms": round(p99, 4),
                "ratio_to_anchor_p50": round(p50 / anchor_p50, 2) if anchor_p50 > 0 else None,
                "target": None,
                "target_met": None,
            }
            if path in TARGET_PATHS:
                row["target_met"], row["target"] = _verdict(size, p50, p99)
            rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("store", "entities", "path", "p50 ms", "p99 ms", "p50/anchor", "target")
    lines = []
    for row in rows:
        target = "" if row["target"] is None else f"{'PASS' if row['target_met'] else 'FAIL'} ({row['target']})"
        lines.append(
            (
                row["store"],
                str(row["entities"]),
                row["path"],
                f"{row['p50_ms']:.3f}",
                f"{row['p99_ms']:.3f}",
                f"{row['ratio_to_anchor_p50']:.1f}x",
                target,
            )
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    right = {1, 3, 4, 5}

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))
        ).rstrip()

    out = [fmt(header), fmt(tuple("-" * w for w in widths))]
    previous = None
    for row, line in zip(rows, lines):
        if previous is not None and (row["store"], row["entities"]) != previous:
            out.append("")
        previous = (row["store"], row["entities"])
        out.append(fmt(line))
    return "\n".join(out)


def _measure_store(
    home: Path,
    kind: str,
    choice: Any,
    redis_url: str,
    start: datetime,
    end: datetime,
    inputs: dict[int, tuple[list[Inputs], list[Inputs]]],
) -> dict[int, dict[str, list[int]]]:
    """One online store: materialized, then per batch size every path checked and timed (samples per path)."""
    import redis

    log(f"[{kind}] apply + materialize {', '.join(BATCH_VIEWS)} ...")
    store = _open_and_load(home, choice, start, end)
    if kind == "sqlite":
        db_path = home / "feast" / "online_store.db"
        tables_by_view = _sqlite_tables(db_path, store.project)
        anchor = sqlite3.connect(db_path)
    else:
        host, port = redis_url.split(":")
        tables_by_view = {}
        anchor = redis.Redis(host=host, port=int(port))
    results = {}
    try:
        paths = paths_for(kind, store, anchor, tables_by_view, store.project)
        for size in SIZES:
            warm, timed = inputs[size]
            check_paths(kind, paths, warm[0])
            log(f"[{kind}] {size} entities: {len(warm)} warm-up + {len(timed)} timed calls per path ...")
            results[size] = time_paths(paths, warm, timed)
    finally:
        anchor.close()
    return results


# --- main --------------------------------------------------------------------------------------------


def run(customers: int, iterations: int | None, provenance: Provenance) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="tollfree-bench-features-"))
    os.environ["TOLLFREE_HOME"] = str(home)
    from serving.settings import export_defaults

    export_defaults(os.environ)  # telemetry off, before Feast is imported
    _quiet_warnings()
    try:
        import feast

        from feature_repo import store as feature_store
        from tests.services import redis_server

        log(f"generating {customers} customers x {DAYS} days of synthetic data in {home} ...")
        tables, transactions, start = _build_tables(home, customers)
        end = datetime.now(UTC)
        ids = {
            "customer_id": np.unique(tables["customer_activity"]["customer_id"].to_numpy()),
            "merchant_id": np.unique(tables["merchant_risk"]["merchant_id"].to_numpy()),
        }
        amounts = transactions["amount"].to_numpy()
        rng = np.random.default_rng(SEED)
        plan = {size: iterations or DEFAULT_ITERATIONS[size] for size in SIZES}
        inputs = {
            size: (make_inputs(rng, max(50, n // 5), size, ids, amounts), make_inputs(rng, n, size, ids, amounts))
            for size, n in plan.items()
        }

        results: dict[tuple[str, int], dict[str, list[int]]] = {}
        with redis_server() as redis_url:
            stores = {
                "sqlite": feature_store.OnlineStoreChoice("sqlite"),
                "redis": feature_store.OnlineStoreChoice("redis", redis_url),
            }
            for kind, choice in stores.items():
                for size, samples in _measure_store(home, kind, choice, redis_url, start, end, inputs).items():
                    results[(kind, size)] = samples
        rows = _rows(results)
        return {
            **provenance.record(),
            "benchmark": "features_online",
            "feature_service": SERVICE,
            "customers": customers,
            "merchants": len(ids["merchant_id"]),
            "days": DAYS,
            "seed": SEED,
            "iterations": {str(k): v for k, v in plan.items()},
            "rounds": ROUNDS,
            "anchors": ANCHORS,
            "targets": {
                "feature_service, 1 entity": "p50 <= 1 ms and p99 <= 2 ms",
                "feature_service, 64 entities": "p99 <= 5 ms",
            },
            "rows": rows,
            "versions": {"feast": feast.__version__, "platform": platform.platform()},
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    result = run(args.customers, args.iterations, Provenance("benchmarks.features_online", argv))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"features_online: FeatureService {result['feature_service']}, {result['customers']} customers, "
        f"{result['merchants']} merchants; feast {result['versions']['feast']}, python {result['python']}, "
        f"{result['cpus']} cpus; in-process wall time per call, {result['rounds']} interleaved rounds; "
        f"{result['seconds']} s in all; 1-min load average before/after {result['loadavg_before'][0]}/"
        f"{result['loadavg_after'][0]}"
    )
    print()
    print(_table(result["rows"]))
    print()
    print("target: set on feature_service; the tollfree_* paths are held to the same budget")
    for kind, text in result["anchors"].items():
        print(f"anchor_raw ({kind}): {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
