"""The stream benchmark's stack: the world (data, features, model), events, a redis-server and a gateway.

The endpoint ``fraud-stream`` serves the world's ``fraud@champion`` with a stream input (source ``tx``, sink
``scores``, dead letters ``tx-dead``); CPU seconds are counted per role (``ROLES``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import redis

from benchmarks.batch_setup import environ, log
from feature_repo import synthetic
from infra.redis import RedisServer
from serving.gateway.process import start_gateway, wait_endpoint_ready
from serving.replicas.local import free_port
from tests.world import build_world

ENDPOINT, SOURCE, SINK, DEAD, GROUP = "fraud-stream", "tx", "scores", "tx-dead", "tollfree"
ROLES = ("gateway", "replicas", "redis", "bench")


def world(work: Path) -> Path:
    """``tests.world.build_world`` in ``work/home``, reused on the day it was built (the features stay in TTL)."""
    home, marker, today = work / "home", work / "world.json", datetime.now(UTC).date().isoformat()
    os.environ.update(
        environ(home, TOLLFREE_TOKEN=os.environ.get("TOLLFREE_TOKEN") or "bench-" + secrets.token_hex(16))
    )
    if not marker.exists() or json.loads(marker.read_text()).get("day") != today:
        shutil.rmtree(home, ignore_errors=True)
        log(f"building the world in {home} (the materialize and train flows) ...")
        build_world()
        marker.write_text(json.dumps({"day": today}))
    return home


def events(home: Path, n: int) -> list[dict[str, str]]:
    rows = synthetic.read_transactions(home / "data").sample(frac=1.0, random_state=7)
    out = [
        {"customer_id": str(c), "merchant_id": str(m), "amount": repr(float(a))}
        for c, m, a in zip(rows["customer_id"], rows["merchant_id"], rows["amount"])
    ]
    return [out[i % len(out)] for i in range(n)]


def append(client: Any, stream: str, batch: list[dict[str, str]]) -> list[str]:
    """``batch`` appended in one pipeline (XADD each); their ids."""
    pipe = client.pipeline(transaction=False)
    for event in batch:
        pipe.xadd(stream, event)
    return [i.decode() for i in pipe.execute()]


class SinkReader:
    """A stream's new entries, read incrementally: event id -> the sink ids of its results."""

    def __init__(self, client: Any, stream: str) -> None:
        last = client.xrevrange(stream, "+", "-", count=1)
        self.client, self.stream, self.cursor = client, stream, "(" + (last[0][0].decode() if last else "0-0")
        self.seen: dict[str, list[str]] = {}

    def poll(self) -> dict[str, list[str]]:
        while chunk := self.client.xrange(self.stream, self.cursor, "+", count=10_000):
            for sink_id, fields in chunk:
                self.seen.setdefault(fields[b"event_id"].decode(), []).append(sink_id.decode())
            self.cursor = "(" + chunk[-1][0].decode()
        return self.seen

    def wait(self, ids: list[str], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not all(map(self.poll().__contains__, ids)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True


class Gateway:
    """This run's redis-server and gateway, the endpoint, and CPU seconds per process."""

    def __init__(self, work: Path, home: Path) -> None:
        # A fresh broker and state store: no autoscaler state kept from an earlier run's endpoint.
        for stale in [*work.glob("redis"), *home.glob("endpoints.db*")]:
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        self.home, self.redis = home, RedisServer(free_port(), work / "redis").start()  # persistent, as the stack's
        self.client, self.token = redis.Redis(port=self.redis.port), os.environ["TOLLFREE_TOKEN"]
        self.process = start_gateway(dict(os.environ), home / "logs" / "gateway-streams-bench.log", timeout_s=240)
        self.api = httpx.Client(
            base_url=self.process.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=120
        )

    def deploy(self, replicas: int | None, create: bool) -> None:
        """The endpoint with ``replicas`` pinned (None: the default scaling), the stream input's default batching."""
        url, entity = self.redis.url, {"entity_name": "fraud", "entity_alias": "champion"}
        pinned = {"min_replicas": replicas, "max_replicas": replicas} if replicas else {}
        config = {
            "served_entities": [{**entity, **pinned}],
            "stream_inputs": [
                {
                    "source": f"{url}/{SOURCE}",
                    "sink": f"{url}/{SINK}",
                    "dead_letter": f"{url}/{DEAD}",
                    "group": GROUP,
                    "batch_size": 100,
                    "max_wait_ms": 10,
                }
            ],
        }
        answer = (
            self.api.post("/api/2.0/serving-endpoints", json={"name": ENDPOINT, "config": config})
            if create
            else self.api.put(f"/api/2.0/serving-endpoints/{ENDPOINT}/config", json=config)
        )
        answer.raise_for_status()
        wait_endpoint_ready(self.process.url, self.token, ENDPOINT, timeout_s=300)

    def cpu(self) -> dict[int, tuple[str, float]]:
        """pid -> (role, user + system CPU seconds) of the gateway, its children (replicas, standby), redis and
        this process."""
        procs = [
            ("gateway", self.process.process.pid),
            ("redis", getattr(self.redis.process, "pid", 0)),
            ("bench", os.getpid()),
        ]
        procs += [("replicas", c.pid) for c in psutil.Process(self.process.process.pid).children(recursive=True)]
        out = {}
        for role, pid in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                out[pid] = (role, sum(psutil.Process(pid).cpu_times()[:2]))
        return out

    def stop(self) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.api.delete(f"/api/2.0/serving-endpoints/{ENDPOINT}")
        self.process.stop(grace_s=60)
        self.redis.stop()

    def cores(self, before: dict[int, tuple[str, float]], seconds: float) -> dict[str, float]:
        """Cores used per role since ``before`` (``cpu()`` then), over ``seconds``; a process that ended is not
        counted."""
        out = dict.fromkeys(ROLES, 0.0)
        for pid, (role, cpu) in self.cpu().items():
            out[role] += cpu - before.get(pid, (role, 0.0))[1]
        return {role: round(v / seconds, 2) for role, v in out.items()}
