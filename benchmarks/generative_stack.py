"""The generative benchmark's stack: a temp home, the ticker model, a replica started here, a gateway with its
endpoints (``chat``, the ticker; ``proxy``, an external model routed back to ``chat``), and the URL of each path."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.batch_setup import environ, log


class Stack:
    """A temp home, the ticker, a replica started here, the gateway with its endpoints; ``stop`` ends all of them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.home = args, Path(tempfile.mkdtemp(prefix="tollfree-bench-generative-"))
        self.gateway: Any = None
        self.token, self.replica_token, self.replica_url = "bench-" + secrets.token_hex(16), secrets.token_hex(16), ""
        self.children: list[Any] = []  # the processes started here: the replica, the load clients

    def start(self) -> None:
        import httpx
        import mlflow

        from benchmarks.ticker_chat import log_ticker
        from serving.gateway.process import start_gateway, wait_endpoint_ready
        from serving.protocol.wire import REPLICA_TOKEN_ENV
        from serving.registry.versions import ensure_experiment
        from serving.replicas.local import start_replica, wait_ready

        env = environ(self.home, TOLLFREE_TOKEN=self.token, TOLLFREE_WARM_POOL="0")
        os.environ.update(env)  # log_ticker registers in this process's tracking URI
        mlflow.set_tracking_uri(env["MLFLOW_TRACKING_URI"])
        mlflow.set_experiment(
            experiment_id=ensure_experiment(mlflow.MlflowClient(), "bench-generative", self.home / "mlartifacts")
        )
        version = log_ticker("ticker", interval_s=self.args.interval_s)
        fast = (
            None if self.args.proxy_interval_s is None else log_ticker("ticker", interval_s=self.args.proxy_interval_s)
        )
        logs = self.home / "logs"  # the replica as the gateway starts one (its own session, this process its owner)
        replica = start_replica(
            f"models:/ticker/{version}", logs / "direct", {**env, REPLICA_TOKEN_ENV: self.replica_token}
        )
        self.children, self.replica_url = [replica.process], replica.url
        (key := self.home / "secrets" / "bench" / "key").parent.mkdir(parents=True)
        key.write_text(self.token)  # the upstream is this gateway: its key is the admin token
        self.gateway = start_gateway(env, logs / "gateway.log", timeout_s=240)
        endpoints = {"chat": version, "proxy": "chat"} | (
            {"chat-fast": fast, "proxy-fast": "chat-fast"} if fast else {}
        )
        with httpx.Client(
            base_url=self.gateway.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60
        ) as api:
            for name, what in endpoints.items():
                entity = (
                    {
                        "entity_name": "ticker",
                        "entity_version": what,
                        "min_replicas": 1,
                        "max_replicas": 1,
                        "max_concurrency": 4096,
                    }
                    if name.startswith("chat")
                    else {
                        "name": "upstream",
                        "external_model": {
                            "name": what,
                            "provider": "openai",
                            "task": "llm/v1/chat",
                            "openai_config": {
                                "openai_api_key": "{{secrets/bench/key}}",
                                "openai_api_base": f"{self.gateway.url}/serving-endpoints",
                            },
                        },
                    }
                )
                api.post(
                    "/api/2.0/serving-endpoints", json={"name": name, "config": {"served_entities": [entity]}}
                ).raise_for_status()
        for name in endpoints:
            wait_endpoint_ready(self.gateway.url, self.token, name, timeout_s=300)
        wait_ready(replica, timeout_s=180)
        log(f"ready: replica {self.replica_url}, gateway {self.gateway.url}, home {self.home}")

    def pids(self) -> dict[str, list[int]]:
        """The server processes by role: the replicas (the direct one and the gateway's), the gateway."""
        import psutil

        ours = [c.pid for c in psutil.Process(self.gateway.process.pid).children(recursive=True)]
        return {"replicas": [self.children[0].pid, *ours], "gateway": [self.gateway.process.pid]}

    def stop(self) -> None:
        import psutil

        left: list[Any] = []
        if self.gateway is not None:
            with contextlib.suppress(psutil.Error):
                left = psutil.Process(self.gateway.process.pid).children(recursive=True)
            self.gateway.stop(grace_s=30)
        for child in [*self.children, *left]:  # SIGTERM; SIGKILL if still there 10 s later
            with contextlib.suppress(psutil.Error, OSError, subprocess.TimeoutExpired):
                child.terminate()
                child.wait(10)
            with contextlib.suppress(psutil.Error, OSError):
                child.kill()
        if not self.args.keep_home:
            shutil.rmtree(self.home, ignore_errors=True)


def targets(stack: Stack, args: argparse.Namespace) -> list[tuple[str, str, str, dict[str, str]]]:
    """(path, label, url, headers) of each run, in order."""

    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}", "content-type": "application/json"}

    gw, admin = stack.gateway.url, auth(stack.token)
    out = [
        ("replica", "(a) replica", f"{stack.replica_url}/invocations", auth(stack.replica_token)),
        ("gateway", "(b) gateway", f"{gw}/serving-endpoints/chat/invocations", admin),
        ("proxy", "(c) proxy (gateway twice)", f"{gw}/serving-endpoints/proxy/invocations", admin),
    ]
    if args.proxy_interval_s is not None:
        out.append(
            (
                "proxy-ceiling",
                f"(c) proxy, ticker at {args.proxy_interval_s * 1000:g} ms (ceiling, extra)",
                f"{gw}/serving-endpoints/proxy-fast/invocations",
                admin,
            )
        )
    return [t for t in out if args.paths is None or t[0] in args.paths]
