"""Measure a candidate model by serving it in a real local replica under a short, bounded load.

``probe_model`` spawns one replica (``serving.replicas.local``), waits until it is ready, sends a
warm-up and then ``requests`` timed POSTs to ``/invocations`` from ``concurrency`` keep-alive
clients, and reads the replica's peak memory and CPU time from ``/proc``. The replica is always
stopped. Latency figures cover successful (HTTP 200) answers only; with none they are NaN, as is
the CPU time per prediction when no row was predicted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import tempfile
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import httpx
import numpy as np

from serving.protocol.wire import REPLICA_TOKEN_ENV
from serving.replicas.local import LocalReplica, start_replica, stop_replica, wait_ready

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProbeResult:
    requests: int  # timed requests that completed (200 or not); fewer than asked only on the time cap
    errors: int  # non-200 answers and transport failures among them
    p50_ms: float
    p99_ms: float
    rps: float
    peak_rss_mb: float  # the replica's VmHWM after the load
    cpu_ms_per_prediction: float  # replica utime+stime over the timed load / rows predicted
    artifact_mb: float
    load_seconds: float  # spawn to ready


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    latency_ms: float
    rows: int


def _dir_mb(root: Path) -> float:
    if root.is_file():
        return root.stat().st_size / 1e6
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) / 1e6


def model_artifact_mb(model_uri: str) -> float:
    """Total size in MB of a model's artifacts (a local path, ``file://``, ``runs:/`` or ``models:/`` URI)."""
    parsed = urlparse(model_uri)
    if parsed.scheme in ("", "file"):
        local = Path(url2pathname(parsed.path) if parsed.scheme else model_uri)
        if not local.exists():
            raise FileNotFoundError(f"no model artifacts at {local}")
        return _dir_mb(local)
    import mlflow.artifacts

    with tempfile.TemporaryDirectory(prefix="tollfree-probe-") as tmp:
        path = mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=tmp)
        return _dir_mb(Path(path))


def _payload_rows(body: Mapping[str, Any]) -> int:
    """Rows in a scoring-protocol body (dataframe_records / dataframe_split / instances / inputs)."""
    if "dataframe_records" in body:
        return len(body["dataframe_records"])
    if "dataframe_split" in body:
        return len(body["dataframe_split"].get("data", []))
    for key in ("instances", "inputs"):
        value = body.get(key)
        if isinstance(value, list):
            return len(value)
        if isinstance(value, Mapping) and value:
            first = next(iter(value.values()))
            return len(first) if isinstance(first, list) else 1
    return 1


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields after "pid (comm)", starting at field 3
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no VmHWM in /proc/{pid}/status")


def _run_phase(
    clients: list[httpx.Client], url: str, bodies: list[tuple[bytes, int]], count: int, deadline: float
) -> list[_Outcome]:
    """Send ``count`` POSTs cycling through ``bodies`` with one worker per client; stop at ``deadline``."""
    lock = threading.Lock()
    next_index = [0]
    outcomes: list[_Outcome] = []

    def worker(client: httpx.Client) -> None:
        while True:
            with lock:
                index = next_index[0]
                if index >= count or time.monotonic() >= deadline:
                    return
                next_index[0] += 1
            body, rows = bodies[index % len(bodies)]
            started = time.perf_counter()
            try:
                remaining = max(deadline - time.monotonic(), 0.05)
                response = client.post(url, content=body, timeout=remaining)
                ok = response.status_code == 200
            except httpx.HTTPError as exc:
                log.warning("probe request failed: %s", type(exc).__name__)
                ok = False
            outcome = _Outcome(ok, (time.perf_counter() - started) * 1000, rows)
            with lock:
                outcomes.append(outcome)

    with ThreadPoolExecutor(max_workers=len(clients), thread_name_prefix="probe") as pool:
        for future in [pool.submit(worker, client) for client in clients]:
            future.result()
    return outcomes


def probe_model(
    model_uri: str,
    payloads: list[dict],
    *,
    log_dir: Path,
    env: Mapping[str, str],
    requests: int = 200,
    concurrency: int = 4,
    warmup: int = 20,
    timeout_s: float = 120.0,
) -> ProbeResult:
    """Serve ``model_uri`` in a fresh local replica, load it briefly and measure latency and cost.

    ``timeout_s`` bounds the wait for readiness and, separately, the whole load (warm-up included):
    at the cap no request starts and those in flight are cut short and counted as errors, so a
    probe that ran out of time shows ``requests`` below what was asked.
    """
    if not payloads:
        raise ValueError("probe_model needs at least one payload")
    if requests < 1 or concurrency < 1 or warmup < 0:
        raise ValueError("requests and concurrency must be >= 1, warmup >= 0")
    bodies = [(json.dumps(p).encode(), _payload_rows(p)) for p in payloads]
    artifact_mb = model_artifact_mb(model_uri)

    token = secrets.token_urlsafe(32)  # the probe's own replica answers only the probe
    spawned = time.monotonic()
    replica: LocalReplica = start_replica(model_uri, log_dir, {**env, REPLICA_TOKEN_ENV: token})
    try:
        wait_ready(replica, timeout_s=timeout_s)
        load_seconds = time.monotonic() - spawned
        url = f"{replica.url}/invocations"
        headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        clients = [httpx.Client(headers=headers, limits=limits) for _ in range(concurrency)]
        try:
            deadline = time.monotonic() + timeout_s
            _run_phase(clients, url, bodies, warmup, deadline)
            cpu_before = _cpu_seconds(replica.pid)
            started = time.perf_counter()
            outcomes = _run_phase(clients, url, bodies, requests, deadline)
            elapsed = time.perf_counter() - started
            cpu_after = _cpu_seconds(replica.pid)
            peak_rss_mb = _peak_rss_mb(replica.pid)
        finally:
            for client in clients:
                client.close()
    finally:
        stop_replica(replica)

    if len(outcomes) < requests:
        log.warning(
            "probe of %s hit its %.0fs cap after %d of %d requests", model_uri, timeout_s, len(outcomes), requests
        )
    latencies = [o.latency_ms for o in outcomes if o.ok]
    rows = sum(o.rows for o in outcomes if o.ok)
    p50, p99 = np.percentile(latencies, [50, 99], method="linear") if latencies else (math.nan, math.nan)
    result = ProbeResult(
        requests=len(outcomes),
        errors=sum(1 for o in outcomes if not o.ok),
        p50_ms=float(p50),
        p99_ms=float(p99),
        rps=len(outcomes) / elapsed if elapsed > 0 else math.nan,
        peak_rss_mb=peak_rss_mb,
        cpu_ms_per_prediction=(cpu_after - cpu_before) * 1000 / rows if rows else math.nan,
        artifact_mb=artifact_mb,
        load_seconds=load_seconds,
    )
    log.info("probe of %s: %s", model_uri, result)
    return result
