"""Where chunks run: in this process one after another, or as tasks on a Dask distributed cluster.

Both engines run the same ``score_chunk`` on the same chunks and so write the same files. The Dask
engine connects to a scheduler address (production: workers share the filesystem of the input, the
output and ``TOLLFREE_HOME``, and run one thread each, as DuckDB and the model parallelise inside a
chunk) or starts a LocalCluster on 127.0.0.1 for one machine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from serving.batch.chunks import (
    Chunk,
    ChunkResult,
    ScoringContext,
    finish_chunk,
    finish_given,
    join_chunk,
    read_given,
    score_chunk,
)

log = logging.getLogger(__name__)

ENGINES = ("local", "dask")


@dataclass(frozen=True)
class DaskOptions:
    address: str | None = None  # a running scheduler, e.g. tcp://10.0.0.5:8786; None starts a LocalCluster
    workers: int = 2  # LocalCluster only: worker processes, one thread each
    memory_limit: str = "auto"  # LocalCluster only: per worker


def run(
    engine: str,
    ctx: ScoringContext,
    chunks: Sequence[Chunk],
    on_done: Callable[[ChunkResult], None],
    dask: DaskOptions | None = None,
) -> list[ChunkResult]:
    if engine == "local":
        return run_local(ctx, chunks, on_done)
    if engine == "dask":
        return run_dask(ctx, chunks, on_done, dask or DaskOptions())
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")


def run_local(
    ctx: ScoringContext, chunks: Sequence[Chunk], on_done: Callable[[ChunkResult], None]
) -> list[ChunkResult]:
    """Chunks in order, one ahead: a worker thread prepares chunk N+1 while this thread finishes chunk N;
    at most two chunks are held at once. With a feature store, preparing is the join (the offline store's
    query, which releases the GIL and leaves part of a core idle) and finishing is on-demand features,
    predict and write; with features given, preparing is reading the rows (parquet decoding releases the
    GIL too) and finishing is predict and write."""
    results = []
    prepare, finish = (join_chunk, finish_chunk) if ctx.service_name is not None else (read_given, finish_given)
    if len(chunks) < 2:
        for chunk in chunks:
            result = score_chunk(ctx, chunk)
            on_done(result)
            results.append(result)
        return results
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-ahead")
    try:
        ahead = pool.submit(prepare, ctx, chunks[0])
        for i, chunk in enumerate(chunks):
            prepared = ahead.result()
            if i + 1 < len(chunks):
                ahead = pool.submit(prepare, ctx, chunks[i + 1])
            result = finish(ctx, chunk, prepared)  # type: ignore[arg-type]  # finish takes what its own prepare made
            on_done(result)
            results.append(result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # a failure waits for the join under way, then stops
    return results


def run_dask(
    ctx: ScoringContext, chunks: Sequence[Chunk], on_done: Callable[[ChunkResult], None], options: DaskOptions
) -> list[ChunkResult]:
    """Submit one task per chunk; results arrive as tasks finish; the first failure cancels the rest."""
    from dask.distributed import Client, LocalCluster, as_completed

    cluster = None
    if options.address:
        client = Client(options.address)
    else:
        cluster = LocalCluster(
            n_workers=options.workers,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address=None,
            memory_limit=options.memory_limit,
        )
        client = Client(cluster)
    try:
        log.info("dask: %d chunks on %s", len(chunks), options.address or f"LocalCluster({options.workers} workers)")
        futures = client.map(
            score_chunk,
            [ctx] * len(chunks),
            chunks,
            pure=False,
            key=[f"score-chunk-{ctx.run_id}-{c.index}" for c in chunks],
        )
        results = []
        try:
            for future in as_completed(futures):
                result = future.result()
                on_done(result)
                results.append(result)
        except BaseException:
            client.cancel(futures)
            raise
        return sorted(results, key=lambda r: r.index)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
