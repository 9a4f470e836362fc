"""``python -m serving --host 127.0.0.1 --port PORT [--admin-port PORT] [--grpc-port PORT]``: the gateway with its
local replicas.

With ``--grpc-port`` (or ``TOLLFREE_GRPC_PORT``) the Open Inference Protocol's gRPC service listens on that port of
``--host`` too (``serving.gateway.oip_grpc``).

With ``--admin-port`` the control plane (the serving-endpoints API, ``/metrics``, ``/openapi.json``)
listens only on that port (bind it to a private interface with ``--admin-host``); ``--port`` then
serves the data plane and the health probes alone.

State folder from ``TOLLFREE_HOME``, registry from ``MLFLOW_TRACKING_URI`` (default: the state
folder's SQLite), admin token from ``TOLLFREE_TOKEN`` (required), endpoint state from
``TOLLFREE_STATE_URL`` (default: ``endpoints.db`` in the state folder; ``postgresql://...`` to share it).
Replicas are local processes unless ``TOLLFREE_BACKEND=kubernetes`` (pods; settings in
``serving.replicas.cluster.connect``).
Once listening, the gateway records its URL (with ``--port 0``, the port it got) in ``$TOLLFREE_HOME/gateways/``,
where flows and the MLflow plugin on the same state folder find it unless ``TOLLFREE_GATEWAY_URL`` is set
(``serving.discovery``); with ``--admin-port``, the admin port's URL.
The gateway migrates the state store's schema when it starts; with ``TOLLFREE_STATE_MIGRATE=manual`` it
refuses an old schema and names the command to run (``python -m serving.state upgrade``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import uvicorn

    from serving.endpoints.store import EndpointStore
    from serving.gateway.listener import RecordingServer
    from serving.settings import Settings

KEEP_ALIVE_S = 75  # seconds an idle client connection stays open (see _server_options)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0: a free port, recorded for clients (default 8080)")
    parser.add_argument(
        "--admin-port",
        type=int,
        default=None,
        help="serve the control plane on this port only (default: on --port with the data plane)",
    )
    parser.add_argument("--admin-host", default=None, help="interface for --admin-port (default: --host)")
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="serve the Open Inference Protocol over gRPC on this port of --host, 0: a free port (default: "
        "TOLLFREE_GRPC_PORT, else no gRPC)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds a replica has to answer before the client gets 504 "
        "(default: TOLLFREE_REQUEST_TIMEOUT_S, else 30)",
    )
    parser.add_argument(
        "--stream-claim-idle",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="claim stream entries another consumer (a stopped gateway) left pending this long (default 30)",
    )
    parser.add_argument("--log-level", default="info")
    return parser


class _Refused(Exception):
    """A setting the gateway cannot start with: main prints it and exits with status 2."""


def main(argv: list[str] | None = None) -> int:
    from serving.settings import export_defaults

    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s gateway %(name)s: %(message)s")
    settings = export_defaults(os.environ)
    try:
        app = _gateway_app(args, settings)
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _serve(app, args, _server_options(args), settings.gateways_dir)
    return 0


def _gateway_app(args: argparse.Namespace, settings: Settings) -> Any:
    """The gateway's ASGI app, from the command line and the environment; _Refused names a setting it cannot
    start with."""
    from serving.edge.api import EdgeApi
    from serving.edge.bundle_files import BundleFiles
    from serving.edge.fleet import Fleet
    from serving.endpoints.manager import EndpointManager
    from serving.endpoints.resolver import mlflow_resolver
    from serving.gateway.app import create_gateway_app
    from serving.gateway.auth import Tokens, authorize
    from serving.gateway.metrics import GatewayMetrics
    from serving.gateway.scrape_targets import ScrapeTargets
    from serving.inference_log import InferenceLogWriter
    from serving.replicas.cluster.connect import ClusterSettingsError, cluster_from_environ
    from serving.replicas.local import REPLICA_HOST_ENV, can_listen_on

    try:
        tokens = Tokens.from_environ(os.environ)
        cluster = cluster_from_environ(os.environ)  # None: local replica processes
    except (ValueError, ClusterSettingsError) as exc:
        raise _Refused(str(exc)) from None
    timeout_s = _request_timeout(args.request_timeout)
    if timeout_s is None:
        raise _Refused(
            "the request timeout (--request-timeout or TOLLFREE_REQUEST_TIMEOUT_S) must be a number of seconds "
            "in (0, 3600]"
        )
    pool = os.environ.get("TOLLFREE_WARM_POOL", "1")
    if not pool.isdigit():
        raise _Refused(f"TOLLFREE_WARM_POOL must be a whole number of standby replicas (got {pool[:20]!r})")
    replica_host = os.environ.get(REPLICA_HOST_ENV)
    if replica_host and not can_listen_on(replica_host):
        raise _Refused(f"{REPLICA_HOST_ENV}={replica_host[:60]!r} is not an address of this machine to listen on")
    grpc_port = args.grpc_port
    if grpc_port is None and os.environ.get("TOLLFREE_GRPC_PORT"):
        grpc_port = int(os.environ["TOLLFREE_GRPC_PORT"]) if os.environ["TOLLFREE_GRPC_PORT"].isdigit() else -1
    if grpc_port is not None and not 0 <= grpc_port <= 65535:
        raise _Refused("the gRPC port (--grpc-port or TOLLFREE_GRPC_PORT) must be a port number, 0 for a free one")
    if grpc_port and grpc_port in (args.port, args.admin_port):
        raise _Refused("--grpc-port must differ from --port and --admin-port")
    if args.admin_port is not None and args.admin_port == args.port and (args.admin_host or args.host) == args.host:
        raise _Refused("--admin-port must differ from --port")
    settings.home.mkdir(parents=True, exist_ok=True)
    manager = EndpointManager(
        _endpoint_store(settings),
        mlflow_resolver(settings.tracking_uri),
        replica_env=os.environ,
        log_dir=settings.home / "logs",
        home=settings.home,
        request_timeout_s=timeout_s,
        cluster=cluster,
    )
    metrics = GatewayMetrics.create()  # one registry: the gateway's, the inference log's, the autoscaler's
    targets = ScrapeTargets(settings.scrape_targets_dir, settings.gateways_dir, lambda: manager.live)
    inference_log = InferenceLogWriter(settings.inference_log_dir, registry=metrics.registry)
    edge = EdgeApi(
        Fleet(manager.store.database),
        BundleFiles(settings.tracking_uri, settings.home / "edge" / "bundles"),
        inference_log,
        admin=lambda header: authorize(tokens, header, None),
        resolve=mlflow_resolver(settings.tracking_uri),
    )
    return create_gateway_app(
        manager,
        tokens,
        inference_log,
        metrics=metrics,
        autoscale=os.environ.get("TOLLFREE_AUTOSCALE", "on") != "off",
        warm_pool_size=int(pool) if cluster is None else 0,  # pods start from their image, not local standbys
        stream_claim_idle_s=args.stream_claim_idle,
        scrape_targets=targets,
        grpc_listen=None if grpc_port is None else (args.host, grpc_port),
        edge=edge,
    )


def _endpoint_store(settings: Settings) -> EndpointStore:
    from serving.endpoints.store import EndpointStore
    from serving.state.database import StateStoreError

    try:
        return EndpointStore(settings.state_url, migrate=os.environ.get("TOLLFREE_STATE_MIGRATE", "auto") != "manual")
    except StateStoreError as exc:  # unreachable, or a schema to migrate first: it names the URL, never its password
        raise _Refused(str(exc)) from None


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's settings for each server the gateway runs."""
    from serving.gateway.http_protocol import OneWriteHttpTools

    # An idle keep-alive connection is kept 75 s (nginx's default; uvicorn's is 5 s): longer than the idle expiry
    # of the clients in front (httpx 5 s, load balancers 60 s), so a client never reuses a connection the gateway
    # is closing at that moment: that race failed a POST with a ReadError, which no client retries by itself.
    return {
        "log_level": args.log_level,
        "access_log": False,
        "timeout_graceful_shutdown": 20,
        "loop": "uvloop",
        "http": OneWriteHttpTools,
        "timeout_keep_alive": KEEP_ALIVE_S,
    }


def _serve(app: Any, args: argparse.Namespace, server: dict[str, Any], records: Path) -> None:
    """Serve until told to stop; the server with the control plane records its URL in ``records``."""
    import uvicorn

    from serving.gateway.listener import RecordingServer

    if args.admin_port is None:
        try:  # as in uvicorn.run: Ctrl-C is a clean stop
            RecordingServer(uvicorn.Config(app, host=args.host, port=args.port, **server), records).run()
        except KeyboardInterrupt:
            pass
        return
    public = uvicorn.Server(uvicorn.Config(app.public(), host=args.host, port=args.port, **server))
    admin = RecordingServer(
        uvicorn.Config(app, host=args.admin_host or args.host, port=args.admin_port, lifespan="off", **server), records
    )
    with asyncio.Runner(loop_factory=public.config.get_loop_factory()) as runner:
        runner.run(_serve_both(public, admin))


def _request_timeout(given: float | None) -> float | None:
    """``--request-timeout``, else ``TOLLFREE_REQUEST_TIMEOUT_S``, else 30; None if not in (0, 3600]."""
    timeout_s = given
    if timeout_s is None:
        try:
            timeout_s = float(os.environ.get("TOLLFREE_REQUEST_TIMEOUT_S", "30"))
        except ValueError:
            return None
    return timeout_s if 0 < timeout_s <= 3600 else None


async def _serve_both(public: uvicorn.Server, admin: RecordingServer) -> None:
    """The public server owns the signals and the app's lifespan (replicas, inference log); the admin
    server follows it: it stops when the public one is told to."""

    async def follow() -> None:
        while not public.should_exit and not admin.should_exit:
            await asyncio.sleep(0.1)
        public.should_exit = admin.should_exit = True

    await asyncio.gather(public.serve(), admin._serve(), follow())


if __name__ == "__main__":
    raise SystemExit(main())
