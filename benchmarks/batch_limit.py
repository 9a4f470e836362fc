"""The limit of batch scoring on this machine, for the features-given row of ``benchmarks.batch``.

    python -m benchmarks.batch_limit --input features-N.parquet --output out.parquet --model-uri URI

What no batch scorer can beat on the same model and files: the features parquet read whole with pyarrow
(the row key and the model's columns), the estimator's own predict method (the one its pyfunc flavor
calls) on one float64 array split across one forked process per core (processes use every core whether
or not the estimator releases the GIL while it predicts), and the row key with the
prediction written as one parquet file and fsynced. No validation, no schema check, no chunking, no
manifest. Prints one JSON line: the seconds of each step (imports and the model load not counted).
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import time
import warnings
from pathlib import Path
from typing import Any

ROW_KEY = "transaction_id"
_shared: dict[str, Any] = {}  # the estimator's method and the matrix, inherited by the forked workers


def _predict_slice(bounds: tuple[int, int]) -> Any:
    return _shared["method"](_shared["matrix"][bounds[0] : bounds[1]])


def limit(input_path: Path, output: Path, model_uri: str, workers: int) -> dict[str, float]:
    import mlflow.pyfunc
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    model = mlflow.pyfunc.load_model(model_uri)
    flavor = model.metadata.flavors["python_function"]
    method = getattr(model.get_raw_model(), flavor.get("predict_fn", "predict"))
    names = model.metadata.get_input_schema().input_names()
    warnings.filterwarnings("ignore", message="X does not have valid feature names", category=UserWarning)
    started = time.perf_counter()
    table = pq.read_table(input_path, columns=[ROW_KEY, *names])
    matrix = np.column_stack([table[name].to_numpy().astype(np.float64, copy=False) for name in names])
    read_s = time.perf_counter() - started
    _shared.update(method=method, matrix=matrix)
    edges = np.linspace(0, len(matrix), workers * 4 + 1).astype(int)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        parts = pool.map(_predict_slice, list(itertools.pairwise(edges)))
    predictions = np.concatenate(parts)
    if predictions.ndim == 2:
        predictions = predictions[:, -1]
    predict_s = time.perf_counter() - started - read_s
    pq.write_table(pa.table({ROW_KEY: table[ROW_KEY], "prediction": predictions}), output)
    with open(output, "rb") as written:
        os.fsync(written.fileno())
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "read_s": read_s,
        "predict_s": predict_s,
        "write_s": seconds - read_s - predict_s,
        "workers": workers,
        "rows": len(predictions),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.batch_limit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--model-uri", required=True)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    print(json.dumps(limit(args.input, args.output, args.model_uri, args.workers)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
