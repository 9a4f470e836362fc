"""The paths the online-features benchmark (benchmarks/features_online.py) times, their inputs, the check
that each returns real data, and the interleaved timing."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

SERVICE = "fraud_v1"
BATCH_VIEWS = ("customer_activity", "merchant_risk")
VIEW_KEYS = {"customer_activity": "customer_id", "merchant_risk": "merchant_id"}
ROUNDS = 4  # timed iterations are split in rounds; each round runs every path in turn


@dataclass
class Inputs:
    """One call's input in every shape the paths need, built outside the timer."""

    columns: dict[str, list]  # columnar entity rows + request field, for get_online_features
    frame: Any  # pandas DataFrame, for OnlineFeatureReader.read
    keys: dict[str, list[bytes]]  # batch view -> unique serialized entity keys (store-specific suffix added later)


def make_inputs(
    rng: np.random.Generator, n: int, size: int, ids: dict[str, np.ndarray], amounts: np.ndarray
) -> list[Inputs]:
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
            view: [key(VIEW_KEYS[view], v) for v in dict.fromkeys(columns[VIEW_KEYS[view]])] for view in BATCH_VIEWS
        }
        out.append(Inputs(columns=columns, frame=pd.DataFrame(columns), keys=keys))
    return out


def paths_for(
    kind: str, store: Any, anchor: Any, tables: dict[str, str], project: str
) -> dict[str, Callable[[Inputs], Any]]:
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


def check_paths(kind: str, paths: dict[str, Callable[[Inputs], Any]], inp: Inputs) -> None:
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


def time_paths(
    paths: dict[str, Callable[[Inputs], Any]], warm: list[Inputs], timed: list[Inputs]
) -> dict[str, list[int]]:
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
