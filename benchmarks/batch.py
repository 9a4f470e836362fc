"""Batch scoring throughput and peak memory: tollfree vs a naive pandas script vs `mlflow models predict`.

    python -m benchmarks.batch [--sizes 1000000,10000000] [--naive-sizes ...] [--features-sizes 1000000]
                               [--mlflow-sizes 1000000] [--chunk-rows N] [--workdir DIR] [--setup-only] [--json]

Set-up (benchmarks/batch_setup.py; once per work dir, ``--workdir`` keeps it between invocations and
completes what is missing):
synthetic data from ``feature_repo.synthetic`` large enough for the biggest size, the feature tables
from ``feature_repo.aggregations``, the Feast definitions applied (DuckDB offline store), a GBDT (100
trees of depth 3, the train flow's model) fitted on 20k point-in-time rows and registered as
``fraud@champion`` with its FeatureService, and the same fitted model logged again with the same
signature but no FeatureService as ``fraud_plain``. Entity-key inputs are the last N transactions
(row key, entity keys, amount, timestamp) as parquet. Features inputs are the same rows' point-in-time
features, computed beforehand (untimed): CSV (the model's columns) for ``mlflow models predict``,
parquet (row key, ``event_timestamp`` and the model's columns) for tollfree, same rows, same order.

Rows (each selectable by its sizes option; an empty list skips it):

    tollfree (local, entity keys)     --sizes           fraud@champion, features joined through Feast
    naive pandas script               --naive-sizes     the entity-key input, one join for everything
    tollfree (local, features given)  --features-sizes  fraud_plain on the features parquet
    limit                             (with each features size) benchmarks.batch_limit on the same parquet
    mlflow models predict             --mlflow-sizes    models:/fraud/V on the features CSV

Every measured run is a fresh process started by a small wrapper (benchmarks/batch_measure.py) that
reports the wall time and the peak RSS of its children (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the
largest single descendant, e.g. the scorer, not the sum with Prefect's API server). Rows/s is rows over
the process's wall time, start-up included; ``work rows/s`` excludes the fixed start-up where the tool
reports it (tollfree: the flow's own timing; naive: its own timing; mlflow: wall minus the wall of the same
command on 10 rows). ``--json`` prints one object: the run's provenance (command, date, commit, load
average before and after), the set-up, every row and the verdicts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import batch_runs as runs
from benchmarks.batch_measure import prefect_server
from benchmarks.batch_report import ENTITY_KEYS, FEATURES_GIVEN, table, verdicts
from benchmarks.batch_setup import MODEL, PLAIN_MODEL, environ, set_up
from benchmarks.common import Provenance


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Every selected row, against one set-up (made or completed in ``--workdir``, else in a temporary dir)."""
    sizes = [int(s) for s in args.sizes.split(",") if s]
    feature_sizes = [int(s) for s in args.features_sizes.split(",") if s]
    mlflow_sizes = [int(s) for s in args.mlflow_sizes.split(",") if s]
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="tollfree-bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        largest = max([*sizes, *feature_sizes, *mlflow_sizes], default=1_000_000)
        info = set_up(work, largest, sorted({*feature_sizes, *mlflow_sizes}))
        setup = {k: v for k, v in info.items() if k not in ("inputs", "features", "features_parquet")}
        if args.setup_only:
            return {"setup": setup, "results": [], "verdicts": [], "chunk_rows": args.chunk_rows}
        env = environ(Path(info["home"]))
        results: list[dict[str, Any]] = []
        with prefect_server(Path(info["home"]), env) if sizes or feature_sizes else contextlib.nullcontext("") as api:
            flow_env = env | {"PREFECT_API_URL": api}
            for size in sizes:
                source = info["inputs"][str(size)]
                champion = f"models:/{MODEL}@champion"
                results.append(runs.tollfree(ENTITY_KEYS, work, source, champion, size, args, flow_env))
                if args.dask:
                    dask = "tollfree (dask, 2 workers, entity keys)"
                    results.append(runs.tollfree(dask, work, source, champion, size, args, flow_env, dask=True))
                if size in args.naive_sizes:
                    results.append(runs.naive_run(work, source, size, args, env))
            for size in feature_sizes:
                plain = f"models:/{PLAIN_MODEL}/{info['plain_model_version']}"
                source = info["features_parquet"][str(size)]
                results.append(runs.tollfree(FEATURES_GIVEN, work, source, plain, size, args, flow_env))
                results.append(runs.limit(work, source, plain, size, args, env))
            if mlflow_sizes:
                results += runs.mlflow_runs(work, info, mlflow_sizes, args, env)
        return {"setup": setup, "results": results, "verdicts": verdicts(results), "chunk_rows": args.chunk_rows}
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("naive", help="(internal) the naive anchor, run in its own process")
    child.add_argument("--input", type=Path, required=True)
    child.add_argument("--output", type=Path, required=True)
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--naive-sizes", default="1000000,10000000")
    parser.add_argument(
        "--features-sizes",
        default="1000000",
        help="tollfree on the features input mlflow models predict gets (model registered without FeatureService)",
    )
    parser.add_argument(
        "--mlflow-sizes", default="1000000", help="mlflow models predict sizes (plus 10 rows for its start-up)"
    )
    parser.add_argument("--chunk-rows", type=int, default=0, help="tollfree --chunk-rows (default: the flow's default)")
    parser.add_argument(
        "--setup-only", action="store_true", help="build (or complete) the set-up in --workdir and stop"
    )
    parser.add_argument("--dask", action="store_true", help="also run the Dask engine (LocalCluster, 2 workers)")
    parser.add_argument("--workdir", default=None, help="keep the set-up here and reuse it")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument(
        "--cap-mb", type=float, default=12_000, help="kill a measured run whose process tree exceeds this RSS"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "naive":
        runs.naive(args.input, args.output)
        return 0
    args.naive_sizes = [int(s) for s in args.naive_sizes.split(",") if s]
    provenance = Provenance("benchmarks.batch", argv)
    result = run_benchmark(args)
    report = {**provenance.record(), **result}
    print(json.dumps(report, indent=2) if args.json else table(report))
    if args.json:
        print(table(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
