"""How the batch benchmark measures a run: a fresh process under a wrapper, and the Prefect API server they share.

The wrapper reports the wall time and the peak RSS of its children (``getrusage(RUSAGE_CHILDREN).ru_maxrss``:
the largest single descendant, e.g. the scorer, not the sum with Prefect's API server), samples the whole
tree's RSS, and kills the tree above a cap.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import PROJECT

WRAPPER = """
import json, resource, subprocess, sys, time
import psutil
started = time.perf_counter()
cap_mb = float(sys.argv[2])
tree_peak = 0.0
with open(sys.argv[1], "w") as out:
    child = subprocess.Popen(sys.argv[3:], stdout=out)
    parent = psutil.Process(child.pid)
    over = False
    while child.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            rss = sum(p.memory_info().rss for p in procs) / 2**20
        except psutil.Error:
            rss = 0.0
        tree_peak = max(tree_peak, rss)
        if rss > cap_mb:
            over = True
            for p in reversed(procs):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        time.sleep(0.2)
print(json.dumps({"code": child.returncode, "wall": time.perf_counter() - started, "over_cap": over,
                  "tree_peak_mb": tree_peak,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def measure(cmd: list[str], env: dict[str, str], timeout: float, cap_mb: float) -> dict[str, Any]:
    """Wall time and peak RSS of ``cmd`` in a fresh wrapper process (killed above ``cap_mb``); its stdout is kept."""
    out_file = Path(tempfile.mkstemp(prefix="bench-batch-", suffix=".out")[1])
    wrapper = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, str(out_file), str(cap_mb), *cmd],
        env=env,
        cwd=PROJECT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = wrapper.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(wrapper.pid, signal.SIGKILL)  # the wrapper and the measured process tree
        wrapper.communicate()
        raise
    done = subprocess.CompletedProcess(wrapper.args, wrapper.returncode, stdout, stderr)
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as exc:
        raise RuntimeError(f"measurement failed for {cmd[:4]}: {done.stderr[-2000:]}") from exc
    result["stdout"] = out_file.read_text()
    out_file.unlink()
    if result["over_cap"]:
        raise RuntimeError(f"killed above the memory cap of {cap_mb:.0f} MB (--cap-mb)")
    if result["code"] != 0:
        raise RuntimeError(
            f"{' '.join(cmd[:4])} ... exited {result['code']}: {result['stdout'][-2000:]} {done.stderr[-2000:]}"
        )
    return result


@contextlib.contextmanager
def prefect_server(home: Path, env: dict[str, str]) -> Iterator[str]:
    """A Prefect API server on 127.0.0.1, as a deployment would have (no temporary server per run)."""
    import httpx

    from serving.replicas.local import free_port

    port = free_port()
    log_file = (home / "prefect-server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log_file,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            if server.poll() is not None:
                raise RuntimeError(f"prefect server exited; see {log_file.name}")
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.wait(30)
        if server.poll() is None:
            server.kill()
        log_file.close()
