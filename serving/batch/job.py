"""A batch scoring run, start to publish: resolve the model, check the input, score chunks, publish.

Order matters: everything that can be wrong with the request (run id, model reference, feature
service or signature, input files, columns, types, emptiness) is checked before the first byte is
written; only then is a hidden staging directory created, filled chunk by chunk, completed with its
manifest and published with one rename (see ``output_layout``). The values' suite (Great Expectations)
runs inline before the first chunk, or in a child process while the chunks are scored
(``validation_process``); its verdict comes before the publish either way. Any failure, a refused input
or a kill leaves no visible output.

Two kinds of model version: one with a FeatureService (the ``feature_service`` tag or model metadata
the train flow writes) is scored from entity keys, features joined point in time through Feast; one
without is scored from the input's own columns, the inputs of its signature (``model_columns``), and
no feature store is opened.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from serving.batch import engines, input_check, model_columns, output_layout, partition, validation_process
from serving.batch.chunks import Chunk, ChunkResult, ScoringContext, plan_chunks, preload
from serving.batch.engines import DaskOptions
from serving.batch.input_check import InputSpec
from serving.registry import versions
from serving.registry.errors import answering

log = logging.getLogger(__name__)

FEATURE_SERVICE_KEY = (
    "feature_service"  # the model metadata key the train flow writes (as serving.replica_server.runtime reads)
)
# measured: joins of 200k-row chunks took 13-30 % less than 100k (CHANGELOG, benchmarks history)
DEFAULT_CHUNK_ROWS = 200_000
WORK_DIR = "_work"  # inside the staging directory: the regrouped input, deleted before publishing


@dataclass(frozen=True)
class ModelRef:
    requested: str  # what the caller asked for, e.g. models:/fraud@champion
    pinned: str  # models:/NAME/VERSION, used for every chunk
    version: str
    feature_service: str | None  # None: the input carries the model's columns itself (``columns``)
    columns: tuple[model_columns.ModelColumn, ...] = ()


@dataclass(frozen=True)
class Progress:
    rows_done: int
    rows_total: int
    chunks_done: int
    chunks_total: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows_done / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class BatchResult:
    rows: int
    output: Path  # the published run directory
    model_uri: str
    model_version: str
    seconds: float
    rows_without_features: int = 0
    files: int = 0
    chunks: int = 0
    engine: str = "local"
    stage_seconds: dict[str, float] = field(default_factory=dict)


def resolve_model(model_uri: str, tracking_uri: str) -> ModelRef:
    """Pin ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION`` to a version, with its FeatureService or, for a
    version without one, its signature's input columns (a version with neither is refused)."""
    from mlflow import MlflowClient

    if not model_uri.startswith("models:/") or len(model_uri) <= len("models:/"):
        raise ValueError(f"model URI must be models:/NAME@ALIAS or models:/NAME/VERSION, got {model_uri[:100]!r}")
    rest = model_uri[len("models:/") :]
    by_alias = "@" in rest
    name, ref = rest.split("@", 1) if by_alias else rest.rsplit("/", 1) if "/" in rest else (rest, "")
    if not by_alias and not ref.isdigit():
        raise ValueError(f"model URI {model_uri!r} names neither an alias (@ALIAS) nor a version number (/N)")
    try:
        with answering(tracking_uri, f"resolving {model_uri}"):
            version = versions.resolve(MlflowClient(tracking_uri), name, ref, alias=by_alias)
    except LookupError as exc:
        raise LookupError(f"no model version found for {model_uri}: {exc}") from exc
    pinned = f"models:/{version.name}/{version.version}"
    service = version.tags.get(FEATURE_SERVICE_KEY)
    if service:
        return ModelRef(model_uri, pinned, str(version.version), service)
    info = _model_info(pinned, tracking_uri)
    service = (info.metadata or {}).get(FEATURE_SERVICE_KEY)
    if service:
        return ModelRef(model_uri, pinned, str(version.version), service)
    columns = model_columns.from_signature(
        info.signature.inputs if info.signature else None, f"{model_uri} (version {version.version})"
    )
    return ModelRef(model_uri, pinned, str(version.version), None, columns)


def _model_info(pinned: str, tracking_uri: str):  # -> mlflow.models.ModelInfo
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    return mlflow.models.get_model_info(pinned)


def input_spec(home: Path, service_name: str, key_column: str) -> InputSpec:
    from feature_repo import store as feature_store

    store = feature_store.open_store(home)
    service = feature_store.feature_service(store, service_name)
    return InputSpec(
        key_column,
        tuple(feature_store.entity_join_keys(store, service)),
        tuple(feature_store.request_fields(store, service)),
    )


def score_dataset(
    input_path: Path,
    output_root: Path,
    model_uri: str,
    home: Path,
    tracking_uri: str,
    run_id: str,
    key_column: str = "transaction_id",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    engine: str = "local",
    dask: DaskOptions | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    regroup: bool = True,
    validation: str = "auto",
) -> BatchResult:
    """Score every row of ``input_path``; publish ``output_root/run=ID/`` atomically (see ``output_layout``).

    ``validation``: where the input's Great Expectations suite runs -- ``auto`` (a child process started at
    once when this process has not loaded Great Expectations yet, see ``validation_process``; else here),
    ``process`` or ``inline``. Inline, the verdict comes before the first chunk; in the child, the chunks are
    scored into the hidden staging directory meanwhile and a refused input stops the run. Either way the
    verdict comes before anything is published, and a refused input leaves no output."""
    started = time.perf_counter()
    _check_arguments(run_id, engine, chunk_rows)
    in_child = validation_process.wanted(validation)
    with validation_process.ValidationProcess() if in_child else contextlib.nullcontext() as validator:
        model, spec, plan = _check_input(Path(input_path), model_uri, home, tracking_uri, key_column, engine, validator)
        checked = time.perf_counter()
        with output_layout.staged(Path(output_root), run_id) as staging:
            chunks = _chunks(plan, spec, chunk_rows, staging / WORK_DIR if regroup else None)
            log.info(
                "batch %s: %d rows in %d file(s), %d chunk(s)%s, %s -> version %s, engine %s%s",
                run_id,
                plan.rows,
                len(plan.files),
                len(chunks),
                f" by {spec.join_keys[0]} range" if regroup and spec.join_keys else "",
                model_uri,
                model.version,
                engine,
                ", features given (no feature service)" if spec.features_given else "",
            )
            ctx = ScoringContext(
                str(Path(home).resolve()),
                tracking_uri,
                model.pinned,
                model.version,
                model.feature_service,
                spec,
                run_id,
                str(staging),
            )
            chunked = time.perf_counter()
            results, waited = _run_chunks(engine, ctx, chunks, dask, plan, validator, on_progress, checked)
            rows = sum(r.rows for r in results)
            if rows != plan.rows:
                raise RuntimeError(f"scored {rows} rows of {plan.rows}: refusing to publish an incomplete run")
            shutil.rmtree(staging / WORK_DIR, ignore_errors=True)
            manifest = _manifest(run_id, model_uri, model, input_path, results, engine, chunk_rows, spec, regroup)
            manifest.update(
                {
                    "seconds": round(time.perf_counter() - started, 3),
                    # before the first chunk: the model resolved and loaded, the input planned (and the suite's verdict
                    # when it ran inline); after the chunks: what the run still waited for its child's verdict
                    "check_seconds": round(checked - started, 3),
                    "chunks_seconds": round(time.perf_counter() - chunked, 3),
                    "verdict_wait_seconds": round(waited, 3),
                }
            )
            output_layout.write_manifest(staging, manifest)
    return _published(run_id, output_layout.run_dir(Path(output_root), run_id), manifest, len(chunks), started)


def _check_arguments(run_id: str, engine: str, chunk_rows: int) -> None:
    output_layout.check_run_id(run_id)
    if engine not in engines.ENGINES:
        raise ValueError(f"engine must be one of {', '.join(engines.ENGINES)}, got {engine!r}")
    if chunk_rows <= 0:
        raise ValueError(f"chunk_rows must be > 0, got {chunk_rows}")


def _published(run_id: str, final: Path, manifest: dict[str, Any], chunks: int, started: float) -> BatchResult:
    """A published run's result, from its manifest, and its log lines."""
    seconds = time.perf_counter() - started
    rows, missing, files = manifest["rows"], manifest["rows_without_features"], len(manifest["files"])
    if missing:
        log.warning(
            "batch %s: %d of %d rows had no features in the store (prediction left null)", run_id, missing, rows
        )
    log.info("batch %s: published %d rows in %d files to %s in %.1f s", run_id, rows, files, final, seconds)
    return BatchResult(
        rows,
        final,
        manifest["model_uri"],
        manifest["model_version"],
        seconds,
        missing,
        files,
        chunks,
        manifest["engine"],
        manifest["stage_seconds"],
    )


def _run_chunks(
    engine: str,
    ctx: ScoringContext,
    chunks: list[Chunk],
    dask: DaskOptions | None,
    plan: input_check.InputPlan,
    validator: validation_process.ValidationProcess | None,
    on_progress: Callable[[Progress], None] | None,
    checked: float,
) -> tuple[list[ChunkResult], float]:
    """Score every chunk into the staging directory. With the suite still running in its child, its verdict is
    taken as soon as it is there (between chunks: a refused input stops the run) and at the latest after the
    last chunk; a chunk that fails on an input the suite refuses raises the suite's error, which names the
    problem. Returns the chunks' results and the seconds waited for the verdict after the last chunk."""
    done = {"rows": 0, "chunks": 0}

    def record(result: ChunkResult) -> None:
        done["rows"] += result.rows
        done["chunks"] += 1
        if on_progress is not None:
            on_progress(Progress(done["rows"], plan.rows, done["chunks"], len(chunks), time.perf_counter() - checked))
        if validator is not None and validator.ready():
            validator.verdict(plan, ctx.spec)

    try:
        results = engines.run(engine, ctx, chunks, record, dask)
    except input_check.BatchInputError:
        raise
    except Exception:
        if validator is not None:
            validator.verdict(plan, ctx.spec)  # raises the suite's error if the input is refused, else the chunk's
        raise
    waiting = time.perf_counter()
    if validator is not None:
        validator.verdict(plan, ctx.spec)
    return results, time.perf_counter() - waiting


def _manifest(
    run_id: str,
    model_uri: str,
    model: ModelRef,
    input_path: Path,
    results: list[ChunkResult],
    engine: str,
    chunk_rows: int,
    spec: InputSpec,
    regroup: bool,
) -> dict:
    rows = sum(r.rows for r in results)
    return {
        "run_id": run_id,
        "model_uri": model_uri,
        "model_version": model.version,
        "pinned_model_uri": model.pinned,
        "feature_service": model.feature_service,
        "input": str(Path(input_path).resolve()),
        "rows": rows,
        "rows_without_features": sum(r.rows_without_features for r in results),
        "files": [{"path": path, "rows": n} for r in results for path, n in r.files],
        "engine": engine,
        "chunk_rows": chunk_rows,
        "finished_at": datetime.now(UTC).isoformat(),
        "user": _user(),
        "stage_seconds": {
            k: round(sum(r.seconds[k] for r in results), 3) for k in ("read", "features", "predict", "write")
        },
        "regrouped_by": spec.join_keys[0] if regroup and spec.join_keys else None,
    }


def _check_input(
    input_path: Path,
    model_uri: str,
    home: Path,
    tracking_uri: str,
    key_column: str,
    engine: str,
    validator: validation_process.ValidationProcess | None,
) -> tuple[ModelRef, InputSpec, input_check.InputPlan]:
    """The model, what it needs of the input, and the input checked against that: its values validated here, or
    handed to ``validator``'s child process (whose verdict the caller takes) while this process loads the model
    it scores with."""
    model = resolve_model(model_uri, tracking_uri)
    if model.feature_service:
        spec = input_spec(home, model.feature_service, key_column)
    else:  # features given: no feature store is opened
        spec = InputSpec(key_column, (), (), model.columns)
    plan = input_check.inspect(input_path, spec)
    if validator is None:
        input_check.validate_values(plan, spec)
    else:
        validator.submit(plan, spec)
        if engine == "local":  # the model (and store) this process scores with load while the child validates
            preload(str(Path(home).resolve()), tracking_uri, model.pinned, model.feature_service)
    return model, spec, plan


def _chunks(plan: input_check.InputPlan, spec: InputSpec, chunk_rows: int, work: Path | None) -> list[Chunk]:
    """Chunks of the input regrouped by the first entity key's range (see ``partition``), or in input order."""
    if work is not None and spec.join_keys:
        buckets = partition.plan_buckets(plan, spec.join_keys[0], chunk_rows)
        plan = partition.write_buckets(plan, spec, buckets, work)
    return plan_chunks(plan, chunk_rows)


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in some containers
        return "unknown"
