"""Helpers for the tests that drive real gateway processes: the session gateway's handle, endpoints created
and waited for, a request body from the world's transactions, a gateway's replica processes and memory."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from feature_repo import synthetic
from serving.discovery import read_records
from serving.gateway.process import GatewayProcess, wait_endpoint_ready
from serving.settings import PROJECT_DIR, Settings
from tests.world import MODEL_NAME

ENDPOINT = "fraud"


@dataclass
class LiveGateway:
    process: GatewayProcess
    admin: str
    scoped: str  # may only use the endpoint "other"
    sent: list[str]  # request ids sent through the data plane
    grpc: str = ""  # host:port of its gRPC service, when it serves one

    @property
    def url(self) -> str:
        return self.process.url

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def invoke(
        self, body: object, token: str | None = None, content_type: str = "application/json", endpoint: str = ENDPOINT
    ) -> httpx.Response:
        request_id = secrets.token_hex(8)
        self.sent.append(request_id)
        content = body if isinstance(body, (bytes, str)) else json.dumps(body)
        with self.client(token if token is not None else self.admin) as client:
            return client.post(
                f"/serving-endpoints/{endpoint}/invocations",
                content=content,
                headers={"content-type": content_type, "x-request-id": request_id},
            )


ENTITY = {"entity_name": MODEL_NAME, "entity_alias": "champion"}


def rows_body(world, n: int = 1, seed: int = 5) -> bytes:  # type: ignore[no-untyped-def]
    tx = synthetic.read_transactions(world.settings.data_dir)
    rows = tx.sample(n, random_state=seed)[["customer_id", "merchant_id", "amount"]]
    return json.dumps({"dataframe_records": rows.to_dict(orient="records")}).encode()


def own_state(folder: Path) -> dict[str, str]:
    """A state store of its own (SQLite in ``folder``), for a test's gateway: started on the world's store, a gateway
    restores every endpoint the worker's earlier tests left there, each a replica to start, and serves them too."""
    return {"TOLLFREE_STATE_URL": f"sqlite:///{folder / 'endpoints.db'}"}


def start_on_any_port(env: Mapping[str, str], log_path: Path, timeout_s: float = 120.0) -> GatewayProcess:
    """``python -m serving --port 0`` with ``env``: the gateway picks its port and names it in the record it keeps in
    its state folder (``serving.discovery``); the URL returned is the record's."""
    records = Settings.from_environ(env).gateways_dir
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=str(PROJECT_DIR),
        )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        mine = [record for _, record in read_records(records) if record.pid == process.pid]
        if mine:
            return GatewayProcess(process, mine[0].url, log_path)
        assert process.poll() is None, f"the gateway exited with code {process.returncode}; see {log_path}"
        time.sleep(0.1)
    GatewayProcess(process, "", log_path).stop()
    raise AssertionError(f"the gateway recorded no URL in {timeout_s:.0f}s; see {log_path}")


def command_words(process: psutil.Process) -> list[str]:
    """A process's command line as words: a replica forked by its gateway's fork server has its command
    line as one string, its process title (``serving.replica_server.fork_server``)."""
    return " ".join(process.cmdline()).split()


def replica_processes(root: psutil.Process, *words: str) -> list[psutil.Process]:
    """The live ``serving.replica_server`` processes under ``root``, at any depth (a forked replica is the child of its
    gateway's fork server), whose command line has each of ``words``."""
    out = []
    for child in root.children(recursive=True):
        try:
            command = command_words(child)
            if (
                "serving.replica_server" in command
                and all(w in command for w in words)
                and child.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def replicas_of(gateway: GatewayProcess) -> list[psutil.Process]:
    """The gateway's serving replica processes (``serving.replica_server --model-uri``)."""
    return replica_processes(psutil.Process(gateway.process.pid), "--model-uri")


def rss_mb(gateway: GatewayProcess) -> float:
    procs = [psutil.Process(gateway.process.pid), *psutil.Process(gateway.process.pid).children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def create(gateway: GatewayProcess, name: str, entity: dict | None = None) -> dict:
    admin = os.environ["TOLLFREE_TOKEN"]
    reply = httpx.post(
        f"{gateway.url}/api/2.0/serving-endpoints",
        headers={"Authorization": f"Bearer {admin}"},
        json={"name": name, "config": {"served_entities": [entity or ENTITY]}},
        timeout=120,
    )
    assert reply.status_code == 200, reply.text
    return wait_ready(gateway.url, name)


def wait_ready(url: str, name: str, timeout_s: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return wait_endpoint_ready(
                url, os.environ["TOLLFREE_TOKEN"], name, timeout_s=max(1.0, deadline - time.monotonic())
            )
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"endpoint {name} not ready in {timeout_s:.0f}s"
            time.sleep(0.5)


def get(gateway: GatewayProcess, path: str) -> httpx.Response:
    return httpx.get(
        f"{gateway.url}{path}", headers={"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}, timeout=60
    )


@dataclass(frozen=True)
class Outcome:
    gateway: int  # index in ``urls`` of the gateway that answered
    sent: float  # monotonic seconds
    answered: float
    status: int
    detail: str = ""  # a failed request's error: the answer's error code and message, or the connection error


class RetryingClients:
    """``concurrency`` closed-loop clients that retry a request on a connection error (refused, reset, closed)
    until it gets an HTTP answer, moving to the next gateway in ``urls`` each time (a load balancer's retry and
    redispatch; with one URL, a client that retries). Each client starts on its own gateway and takes turns.
    One :class:`Outcome` per request, its retries included. With ``retry=False``, plain clients: a connection
    error is an outcome of status 0 (a failed request). ``think_s``: each client's pause after an answer (load
    below what the machine serves, rather than all of it: the tests beside it share the cores)."""

    def __init__(
        self, urls: list[str], path: str, body: bytes, concurrency: int, *, retry: bool = True, think_s: float = 0.0
    ) -> None:
        self.outcomes: list[Outcome] = []
        self.retries = 0
        self._stop = threading.Event()
        headers = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}", "content-type": "application/json"}

        def client(at: int) -> None:
            with httpx.Client(headers=headers, timeout=60) as http:
                while not self._stop.is_set():
                    sent = time.monotonic()
                    detail = ""
                    while True:
                        try:
                            reply = http.post(f"{urls[at]}{path}", content=body)
                            status = reply.status_code
                            detail = "" if status == 200 else reply.text[:200]
                            break
                        except httpx.TransportError as error:
                            if not retry:
                                status, detail = 0, repr(error)
                                break
                            self.retries += 1
                            at = (at + 1) % len(urls)
                            time.sleep(0.02)
                    self.outcomes.append(Outcome(at, sent, time.monotonic(), status, detail))
                    at = (at + 1) % len(urls)
                    if think_s:
                        self._stop.wait(think_s)

        self.threads = [threading.Thread(target=client, args=(i % len(urls),), daemon=True) for i in range(concurrency)]
        for thread in self.threads:
            thread.start()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self.threads:
            thread.join(90)
        assert not any(t.is_alive() for t in self.threads), "a client hung"
        return self.outcomes
