"""``python -m serving.replica_server --model-uri models:/NAME/VERSION --host 127.0.0.1 --port PORT``: one replica
process (``--standby`` instead of ``--model-uri``: a warm-pool replica that waits for ``POST /load``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from pathlib import Path
from typing import Any

import uvicorn

from serving.replica_server.imports import import_runtime, skip_feast_type_checks

skip_feast_type_checks()  # before anything below imports Feast

from serving.heap import settle_heap  # noqa: E402  (after skip_feast_type_checks)
from serving.protocol.wire import REPLICA_KEEP_ALIVE_S, REPLICA_TOKEN_ENV  # noqa: E402  (after skip_feast_type_checks)
from serving.replica_server.app import create_replica_app  # noqa: E402  (after skip_feast_type_checks)
from serving.replica_server.chat import load_runtime  # noqa: E402  (after skip_feast_type_checks)
from serving.replica_server.frames_server import FrameListener  # noqa: E402  (after skip_feast_type_checks)
from serving.replica_server.owner import DEFAULT_ORPHAN_S, ORPHAN_ENV, Adoptable, OwnerWatch, first_owner, watch  # noqa: E402  (after skip_feast_type_checks)
from serving.replica_server.standby import StandbyApp  # noqa: E402  (after skip_feast_type_checks)

log = logging.getLogger("serving.replica_server")


def _preload_runtime(home: Path) -> Any:
    """Import what loading a model will need and open the registry's database (SQLAlchemy's engine and
    MLflow's schema check cost seconds on first use), so a warm replica pays only for the model itself."""
    from mlflow import MlflowClient

    from feature_repo import store

    import_runtime()
    try:
        MlflowClient().search_registered_models(max_results=1)
        feature_store = store.open_store(home)
        feature_store.list_feature_services()  # the registry, read once
        return feature_store
    except Exception as exc:  # the model load will say what is wrong, precisely
        log.warning("standby preload incomplete: %s", type(exc).__name__)
        return None


def _orphan_grace_s(environ: Any) -> float:
    try:
        return max(1.0, float(environ.get(ORPHAN_ENV) or DEFAULT_ORPHAN_S))
    except ValueError:
        log.warning("%s is not a number of seconds: using %.0f", ORPHAN_ENV, DEFAULT_ORPHAN_S)
        return DEFAULT_ORPHAN_S


class ReplicaServer(uvicorn.Server):
    """uvicorn's HTTP server with the framed hop's socket (``frames_server``) beside it on the same event loop.
    Its shutdown stops the frame socket first (the calls in flight answered), then does uvicorn's: uvicorn ends
    the process with the signal it caught as soon as ``serve`` returns, so nothing after that would run."""

    def __init__(self, config: uvicorn.Config, app: Any, token: str | None) -> None:
        super().__init__(config)
        self.app = app  # ReplicaApp or StandbyApp: it names its frame socket in its batch answers
        self.frames = FrameListener(lambda: getattr(app, "inner", app), token)

    async def serve(self, sockets: Any = None) -> None:
        try:
            await self.frames.start(self.app.frames_address)
        except OSError as exc:  # the gateway then keeps to HTTP: no answer names the socket
            log.warning("no frame socket at %s (%s): HTTP only", self.app.frames_address, exc)
            self.app.frames_address = None
        await super().serve(sockets)

    async def shutdown(self, sockets: Any = None) -> None:
        await self.frames.close(grace_s=self.config.timeout_graceful_shutdown or 30.0)
        await super().shutdown(sockets)


def main(argv: list[str] | None = None) -> int:
    from serving.settings import export_defaults

    parser = argparse.ArgumentParser(
        prog="python -m serving.replica_server", description="Serve one MLflow model as a tollfree replica."
    )
    parser.add_argument("--model-uri", help="the model to serve (required unless --standby)")
    parser.add_argument("--standby", action="store_true", help="warm pool: import the runtime, wait for POST /load")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if not args.standby and not args.model_uri:
        parser.error("--model-uri is required (or --standby)")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s replica[%(process)d] %(name)s: %(message)s"
    )
    settings = export_defaults(os.environ)
    # MLflow traces every call of a ResponsesAgent by default: in a replica that is a registry write per request,
    # into the default experiment (its artifacts in ./mlruns). Sampled at 0 here, unless the environment asks
    # for traces. Not mlflow.tracing.disable(): with tracing off, MLflow 3.17.2's trace_disabled wrapper calls
    # the function while holding its lock, so a model whose load_context loads another model (load_model
    # inside load_model) deadlocks, as log_model did in a process that had turned tracing off.
    os.environ.setdefault("MLFLOW_TRACE_SAMPLING_RATIO", "0")
    import mlflow

    mlflow.set_tracking_uri(settings.tracking_uri)
    token = os.environ.get(REPLICA_TOKEN_ENV) or None
    loaded: list[Any] = []  # the app, once a model can serve: only then may a new gateway adopt us
    # watched from the start: a replica still loading when its gateway dies stops at once (nobody knows of it)
    owner = OwnerWatch(
        first_owner(os.environ),
        _orphan_grace_s(os.environ),
        adoptable=lambda: bool(loaded) and getattr(loaded[0], "inner", True) is not None,
    )
    watch(owner)
    app: Any
    if args.standby:
        started = time.perf_counter()
        app = StandbyApp(Path(settings.home), token=token, store=_preload_runtime(Path(settings.home)))
        log.info("standby ready to load a model (preloaded in %.2fs)", time.perf_counter() - started)
    else:
        started = time.perf_counter()
        runtime = load_runtime(args.model_uri, Path(settings.home))
        runtime.warm()
        runtime.profile()
        settle_heap()
        app = create_replica_app(
            runtime, token=token, model_uri=args.model_uri, load_seconds=time.perf_counter() - started
        )
    loaded.append(app)
    app.frames_address = f"unix:@tollfree/replica/{os.getpid()}/{args.port}"
    config = uvicorn.Config(
        Adoptable(app, owner, token),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        timeout_keep_alive=REPLICA_KEEP_ALIVE_S,
    )
    server = ReplicaServer(config, app, token)
    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(server.serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
