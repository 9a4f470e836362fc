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

Each path gets the same seeded random rows (ids that exist, amounts drawn from real transactions), one
fresh set per iteration; paths run in interleaved rounds so machine noise spreads over all of them.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np

SERVICE = "fraud_v1"
BATCH_VIEWS = ("customer_activity", "merchant_risk")
VIEW_KEYS = {"customer_activity": "customer_id", "merchant_risk": "merchant_id"}
SIZES = (1, 64)
DEFAULT_ITERATIONS = {1: 2000, 64: 500}
DAYS = 36
SEED = 20261
ROUNDS = 4  # timed iterations are split in rounds; each round runs every path in turn
PATHS = ("feature_service", "tollfree_reader", "tollfree_fast", "tollfree_fast_cold", "no_odfv_refs", "anchor_raw")
TARGETS = {1: {"p50_ms": 1.0, "p99_ms": 2.0}, 64: {"p99_ms": 5.0}}
TARGET_PATHS = ("feature_service", "tollfree_reader", "tollfree_fast", "tollfree_fast_cold")  # the target is on feature_service

ANCHORS = {
    "sqlite": (
        "one sqlite3 connection (no type detection) to Feast's online_store.db; per batch view, the same "
        "statement Feast's SQLite store runs: SELECT entity_key, feature_name, value, event_ts FROM "
        "\"tollfree_<view>\" WHERE entity_key IN (<unique keys>) ORDER BY entity_key, then fetchall(); "
        "keys pre-serialized (serialize_entity_key v3) outside the timer; values stay protobuf bytes"
    ),
    "redis": (
        "one redis-py client; a single non-transactional pipeline of HGETALL on Feast's key "
        "(serialize_entity_key v3 + b'tollfree') for each unique customer and merchant, then execute(); "
        "keys pre-built outside the timer; values stay protobuf bytes (Feast itself sends HMGET of the "
        "same hash fields)"
    ),
}


@dataclass
class Inputs:
    """One call's input in every shape the paths need, built outside the timer."""

    columns: dict[str, list]  # columnar entity rows + request field, for get_online_features
    frame: Any  # pandas DataFrame, for OnlineFeatureReader.read
    keys: dict[str, list[bytes]]  # batch view -> unique serialized entity keys (store-specific suffix added later)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.features_online", description=__doc__.split("\n\n")[0])
    parser.add_argument("--customers", type=int, default=1000, help="synthetic customers (default 1000)")
    parser.add_argument(
        "--iterations", type=int, default=None,
        help="timed calls per path and batch size (default 2000 for 1 entity, 500 for 64)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    if args.customers < 64:
        parser.error("--customers must be >= 64")
    if args.iterations is not None and args.iterations < ROUNDS:
        parser.error(f"--iterations must be >= {ROUNDS}")
    return args


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


# --- set-up ------------------------------------------------------------------------------------------


def _build_tables(home: Path, customers: int) -> tuple[dict, Any, datetime]:
    from feature_repo import aggregations, synthetic
    from feature_repo import store as feature_store

    start = datetime.now(timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=DAYS)
    data = synthetic.generate(synthetic.SyntheticConfig(n_customers=customers, days=DAYS, start=start))
    tables = aggregations.feature_tables(data.transactions, data.customers["customer_id"], data.merchants["merchant_id"])
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


def _make_inputs(rng: np.random.Generator, n: int, size: int, ids: dict[str, np.ndarray], amounts: np.ndarray) -> list[Inputs]:
    import pandas as pd
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    def key(join_key: str, value: int) -> bytes:
        proto = EntityKey(join_keys=[join_key], entity_values=[Value(int64_val=value)])
        return serialize_entity_key(proto, entity_key_serialization_version=3)

    out = []
    for _ in range(n):
        customers = [int(v) for v in rng.choice(ids["customer_id"], size)]
        merchants = [int(v) for v in rng.choice(ids["merchant_id"], size)]
        amount = [float(v) for v in rng.choice(amounts, size)]
        columns = {"customer_id": customers, "merchant_id": merchants, "amount": amount}
        keys = {
            view: [key(VIEW_KEYS[view], v) for v in dict.fromkeys(columns[VIEW_KEYS[view]])]
            for view in BATCH_VIEWS
        }
        out.append(Inputs(columns=columns, frame=pd.DataFrame(columns), keys=keys))
    return out


# --- the paths ---------------------------------------------------------------------------------------


def _paths(kind: str, store: Any, anchor: Any, tables: dict[str, str], project: str) -> dict[str, Callable[[Inputs], Any]]:
    from serving.features.reader import OnlineFeatureReader

    service = store.get_feature_service(SERVICE)
    reader = OnlineFeatureReader(store, SERVICE, fast=False)
    fast_reader = OnlineFeatureReader(store, SERVICE, fast=True)
    cold_reader = OnlineFeatureReader(store, SERVICE, fast=True)
    if not (fast_reader.fast and cold_reader.fast):
        raise RuntimeError(f"{kind}: the direct online store reader refused this store (see the log)")
    cold_keys = cold_reader._fast.store_reader._key_cache  # emptied per call: no entity key is cached
    refs = [
        f"{projection.name}:{feature.name}"
        for projection in service.feature_view_projections
        if projection.name in BATCH_VIEWS
        for feature in projection.features
    ]

    def feature_service(inp: Inputs) -> Any:
        return store.get_online_features(features=service, entity_rows=inp.columns).to_dict()

    def tollfree_reader(inp: Inputs) -> Any:
        return reader.read(inp.frame)

    def tollfree_fast(inp: Inputs) -> Any:
        return fast_reader.read(inp.frame)

    def tollfree_fast_cold(inp: Inputs) -> Any:
        cold_keys.clear()
        return cold_reader.read(inp.frame)

    def no_odfv_refs(inp: Inputs) -> Any:
        return store.get_online_features(features=refs, entity_rows=inp.columns).to_dict()

    if kind == "sqlite":

        def anchor_raw(inp: Inputs) -> Any:
            rows = []
            for view in BATCH_VIEWS:
                keys = inp.keys[view]
                rows.append(
                    anchor.execute(
                        f'SELECT entity_key, feature_name, value, event_ts FROM "{tables[view]}" '
                        f"WHERE entity_key IN ({','.join('?' * len(keys))}) ORDER BY entity_key",
                        keys,
                    ).fetchall()
                )
            return rows
    else:
        suffix = project.encode("utf-8")

        def anchor_raw(inp: Inputs) -> Any:
            with anchor.pipeline(transaction=False) as pipe:
                for view in BATCH_VIEWS:
                    for key in inp.keys[view]:
                        pipe.hgetall(key + suffix)
                return pipe.execute()

    return {
        "feature_service": feature_service,
        "tollfree_reader": tollfree_reader,
        "tollfree_fast": tollfree_fast,
        "tollfree_fast_cold": tollfree_fast_cold,
        "no_odfv_refs": no_odfv_refs,
        "anchor_raw": anchor_raw,
    }


def _check_paths(kind: str, paths: dict[str, Callable[[Inputs], Any]], inp: Inputs) -> None:
    """Every path returns real data for existing ids before anything is timed."""
    answer = paths["feature_service"](inp)
    empty = [name for name, values in answer.items() if any(v is None for v in values)]
    if empty:
        raise RuntimeError(f"{kind}: feature service returned no value for {empty}")
    import pandas as pd

    slow = paths["tollfree_reader"](inp)  # raises (404) on an unknown entity
    pd.testing.assert_frame_equal(paths["tollfree_fast"](inp), slow, check_exact=True)
    pd.testing.assert_frame_equal(paths["tollfree_fast_cold"](inp), slow, check_exact=True)
    raw = paths["anchor_raw"](inp)
    if kind == "sqlite":
        expected = [7 * len(inp.keys["customer_activity"]), 2 * len(inp.keys["merchant_risk"])]
        got = [len(rows) for rows in raw]
    else:
        expected = [8] * len(inp.keys["customer_activity"]) + [3] * len(inp.keys["merchant_risk"])
        got = [len(fields) for fields in raw]  # 7 or 2 features + the view's _ts field
    if got != expected:
        raise RuntimeError(f"{kind}: the anchor read {got} rows/fields, expected {expected}")


def _time_paths(paths: dict[str, Callable[[Inputs], Any]], warm: list[Inputs], timed: list[Inputs]) -> dict[str, list[int]]:
    for fn in paths.values():
        for inp in warm:
            fn(inp)
    samples: dict[str, list[int]] = {name: [] for name in paths}
    bounds = np.linspace(0, len(timed), ROUNDS + 1).astype(int)
    clock = time.perf_counter_ns
    for r in range(ROUNDS):
        chunk = timed[bounds[r] : bounds[r + 1]]
        for name, fn in paths.items():
            gc.collect()
            out = samples[name]
            for inp in chunk:
                t0 = clock()
                fn(inp)
                out.append(clock() - t0)
    return samples


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
            (row["store"], str(row["entities"]), row["path"], f"{row['p50_ms']:.3f}", f"{row['p99_ms']:.3f}",
             f"{row['ratio_to_anchor_p50']:.1f}x", target)
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    right = {1, 3, 4, 5}

    def fmt(cells: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [fmt(header), fmt(tuple("-" * w for w in widths))]
    previous = None
    for row, line in zip(rows, lines):
        if previous is not None and (row["store"], row["entities"]) != previous:
            out.append("")
        previous = (row["store"], row["entities"])
        out.append(fmt(line))
    return "\n".join(out)


# --- main --------------------------------------------------------------------------------------------


def run(customers: int, iterations: int | None) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="tollfree-bench-features-"))
    os.environ["TOLLFREE_HOME"] = str(home)
    from serving.settings import export_defaults

    export_defaults(os.environ)  # telemetry off, before Feast is imported
    _quiet_warnings()
    try:
        import feast
        import redis

        from feature_repo import store as feature_store
        from tests.services import redis_server

        began = time.monotonic()
        load_before = os.getloadavg()
        _log(f"generating {customers} customers x {DAYS} days of synthetic data in {home} ...")
        tables, transactions, start = _build_tables(home, customers)
        end = datetime.now(timezone.utc)
        ids = {
            "customer_id": np.unique(tables["customer_activity"]["customer_id"].to_numpy()),
            "merchant_id": np.unique(tables["merchant_risk"]["merchant_id"].to_numpy()),
        }
        amounts = transactions["amount"].to_numpy()
        rng = np.random.default_rng(SEED)
        plan = {size: iterations or DEFAULT_ITERATIONS[size] for size in SIZES}
        inputs = {
            size: (_make_inputs(rng, max(50, n // 5), size, ids, amounts), _make_inputs(rng, n, size, ids, amounts))
            for size, n in plan.items()
        }

        results: dict[tuple[str, int], dict[str, list[int]]] = {}
        with redis_server() as redis_url:
            stores = {
                "sqlite": feature_store.OnlineStoreChoice("sqlite"),
                "redis": feature_store.OnlineStoreChoice("redis", redis_url),
            }
            for kind, choice in stores.items():
                _log(f"[{kind}] apply + materialize {', '.join(BATCH_VIEWS)} ...")
                store = _open_and_load(home, choice, start, end)
                if kind == "sqlite":
                    db_path = home / "feast" / "online_store.db"
                    tables_by_view = _sqlite_tables(db_path, store.project)
                    anchor = sqlite3.connect(db_path)
                else:
                    host, port = redis_url.split(":")
                    tables_by_view = {}
                    anchor = redis.Redis(host=host, port=int(port))
                try:
                    paths = _paths(kind, store, anchor, tables_by_view, store.project)
                    for size in SIZES:
                        warm, timed = inputs[size]
                        _check_paths(kind, paths, warm[0])
                        _log(f"[{kind}] {size} entities: {len(warm)} warm-up + {len(timed)} timed calls per path ...")
                        results[(kind, size)] = _time_paths(paths, warm, timed)
                finally:
                    anchor.close()
        rows = _rows(results)
        return {
            "benchmark": "features_online",
            "feature_service": SERVICE,
            "customers": customers,
            "merchants": int(len(ids["merchant_id"])),
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
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "feast": feast.__version__,
                "platform": platform.platform(),
                "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
            },
            "seconds": round(time.monotonic() - began, 1),
        }
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    result = run(args.customers, args.iterations)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    m = result["machine"]
    print(
        f"features_online: FeatureService {result['feature_service']}, {result['customers']} customers, "
        f"{result['merchants']} merchants; feast {m['feast']}, python {m['python']}, {m['cpus']} cpus; "
        f"in-process wall time per call, {result['rounds']} interleaved rounds; {result['seconds']} s in all; "
        f"1-min load average before/after {m['loadavg_1m_before_after'][0]}/{m['loadavg_1m_before_after'][1]}"
    )
    print()
    print(_table(result["rows"]))
    print()
    print("target: the issue's target is on feature_service; the tollfree_* paths are held to the same budget")
    for kind, text in result["anchors"].items():
        print(f"anchor_raw ({kind}): {text}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
