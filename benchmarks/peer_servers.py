"""The peer servers of the serving benchmark (benchmarks/peers.py): the same joblib-pickled scikit-learn model
served by what users would pick instead of tollfree, each from its own venv (benchmarks/peer_envs.py), on
127.0.0.1 only. Each start_<kind>() writes its script or config into `workdir`, starts one process tree in its
own session (log: logs/<kind>.log), waits until it answers, and returns a Server (benchmarks/serving_servers.py)
whose pid is the root of that tree. Every server takes numeric rows (a float array) or records (dicts, made
into a DataFrame with pd.DataFrame.from_records) and returns `predict`'s labels; benchmarks/peer_wire.py
speaks each one's native format.

- mlserver: `mlserver start` (MLServer 1.7.1, mlserver_sklearn.SKLearnModel), `parallel_workers` inference
  processes behind one uvicorn front process; V2 protocol: rows as one FP64 tensor, records as a pandas-codec
  request (one input per column, strings as BYTES). Traps: MLServer 1.7.1's inference workers die at start
  with uvloop 0.23 ("There is no current event loop"; the env pins 0.21); its gRPC server cannot be switched
  off in 1.7.1, so it gets its own free port on 127.0.0.1 (ss shows [::ffff:127.0.0.1]); metrics are
  off (metrics_endpoint null) and `debug: false` is what turns the access log off; `host` defaults to 0.0.0.0.
  Adaptive batching: max_batch_size 1 (off) or 32 / 2 ms.
- bentoml: `bentoml serve` of a new-style @bentoml.service (BentoML 1.4): a circus arbiter and `workers`
  worker processes sharing one socket; POST /predict {"instances": rows}; batching: @bentoml.api(batchable=True,
  max_batch_size=1024, max_latency_ms=60000). BENTOML_HOME is kept in workdir, tracking is off. Traps: BentoML
  counts max_batch_size in rows, not requests (1024 = 32 requests of up to 32 rows; it splits larger ones),
  and its max_latency_ms is not a wait but a deadline past which it sheds requests with 503 "process is
  overloaded" (at 10 ms, 16 concurrent requests got 503s): 60 s, its default, so it sheds nothing, like the
  other peers; how long it waits to fill a batch it learns by itself. Circus
  setsid()s the workers, so they are outside the server's process group (still its descendants): stop
  kills the tree found from /proc, not only the group. The arbiter also listens on two loopback ports.
- rayserve: a foreground script (Ray 2.60): ray.init (local cluster, no dashboard, node ip 127.0.0.1, temp
  dir in workdir or, where that path is too long for Ray's unix sockets, a short one under /tmp), serve.start
  on 127.0.0.1, a deployment of `workers` replicas (num_cpus 0 each, so any count fits 2 cores); batching:
  @serve.batch(32, 2 ms). POST / {"instances": rows}. Traps: ray.init swaps _node_ip_address="127.0.0.1" for
  the machine's IP and then binds agents there and GCS/raylet/worker gRPC servers on all interfaces: the
  script sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (Ray's single-machine path), after which they all bind
  loopback; each replica's inter-deployment gRPC server is hard-coded to "[::]:0": patched in the replica to
  127.0.0.1. Ray's metrics servers take fixed loopback ports (44217, 44227, 52365): one Ray peer at a time.
  Start-up ~25-45 s. Stop SIGTERMs the driver only (a group SIGTERM kills the raylet under the driver's
  serve.shutdown(), which then hangs), then SIGKILLs what is left of the tree; no `ray stop --force`, which
  kills every Ray process on the machine by name.
- kserve: a kserve.Model subclass in kserve.ModelServer (KServe 0.21), V1 protocol at
  /v1/models/peer:predict, gRPC off. Trap: KServe hard-codes host="0.0.0.0" in the uvicorn.Config its
  RESTServer builds and has no option for it; the script patches RESTServer.__init__ to set 127.0.0.1 before
  any socket is bound (with workers > 1 the parent binds and hands the socket to spawned children, which
  re-import the script); its access log and per-request timing log ("kserve.trace") are silenced by wrapping
  kserve.logging.configure_logging. Readiness waits for every worker's "Application startup complete." (the
  first worker answers while the second is still importing). KServe has no adaptive batching: `batching`
  is ignored.
- uvicorn: a bare ASGI app (no model) answering {"predictions": [0]}, uvicorn --workers N with uvloop and
  httptools: the ceiling for a Python HTTP server on this machine; `batching` is ignored.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.peer_process import BATCH_SIZE, BATCH_WAIT_S, ROWS_CODE, loopback_port, start_process
from benchmarks.peer_wire import MODEL_NAME
from benchmarks.serving_servers import Server

PEER_KINDS = ("mlserver", "bentoml", "rayserve", "kserve", "uvicorn")
# ---------------------------------------------------------------------------------------------- the peers


def start_mlserver(
    python: Path, model_path: Path, workdir: Path, logs: Path, *, workers: int = 2, batching: bool = False
) -> Server:
    port, grpc_port = loopback_port(), loopback_port()
    settings = {
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": grpc_port,
        "parallel_workers": workers,
        "metrics_endpoint": None,
        "debug": False,
        "load_models_at_startup": True,
        "model_repository_root": str(workdir / "models"),
        "environments_dir": str(workdir / "envs"),
        "metrics_dir": str(workdir / "metrics"),
    }
    model = {
        "name": MODEL_NAME,
        "implementation": "mlserver_sklearn.SKLearnModel",
        "parameters": {"uri": str(Path(model_path).resolve())},
        "max_batch_size": BATCH_SIZE if batching else 1,
        "max_batch_time": BATCH_WAIT_S if batching else 0,
    }
    repo = workdir / "models" / MODEL_NAME
    repo.mkdir(parents=True, exist_ok=True)
    (workdir / "settings.json").write_text(json.dumps(settings, indent=1))
    (repo / "model-settings.json").write_text(json.dumps(model, indent=1))
    cmd = [str(python.parent / "mlserver"), "start", str(workdir)]
    return start_process(
        "mlserver",
        cmd,
        python,
        workdir,
        logs,
        f"http://127.0.0.1:{port}",
        f"/v2/models/{MODEL_NAME}/ready",
        f"/v2/models/{MODEL_NAME}/infer",
    )


_BENTOML_CODE = """
import bentoml

MODEL_PATH, WORKERS, BATCHING, MAX_BATCH_ROWS, MAX_LATENCY_MS = {args}


@bentoml.service(workers=WORKERS, logging={{"access": {{"enabled": False}}}}, metrics={{"enabled": False}})
class Peer:
    def __init__(self) -> None:
        self.model = joblib.load(MODEL_PATH)

    if BATCHING:  # BentoML concatenates the batched requests' lists and splits the returned list back
        @bentoml.api(batchable=True, max_batch_size=MAX_BATCH_ROWS, max_latency_ms=MAX_LATENCY_MS)
        def predict(self, instances: list) -> list:
            return predict_rows(self.model, instances)
    else:
        @bentoml.api
        def predict(self, instances: list) -> list:
            return predict_rows(self.model, instances)
"""


def start_bentoml(
    python: Path, model_path: Path, workdir: Path, logs: Path, *, workers: int = 2, batching: bool = False
) -> Server:
    port = loopback_port()
    args = (str(Path(model_path).resolve()), workers, batching, BATCH_SIZE * 32, 60_000)  # rows; a 503 deadline
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "bento_peer.py").write_text(ROWS_CODE + _BENTOML_CODE.format(args=repr(args)))
    cmd = [str(python.parent / "bentoml"), "serve", "bento_peer:Peer", "--host", "127.0.0.1", "--port", str(port)]
    return start_process(
        "bentoml",
        cmd,
        python,
        workdir,
        logs,
        f"http://127.0.0.1:{port}",
        "/readyz",
        "/predict",
        ready_log=("Service Peer initialized", workers),
    )


_RAY_CODE = """
# Ray swaps a node address of 127.0.0.1 for the machine's own IP and then binds its agents there and its
# gRPC servers (GCS, raylet, workers) on all interfaces, except where clusters are "not supported" (macOS,
# Windows): this variable makes Linux take that path, so the node address stays 127.0.0.1 and every listener
# binds loopback. Set before ray is imported, inherited by every process Ray starts.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"

import signal
import threading

import ray
from ray import serve
from starlette.requests import Request

MODEL_PATH, WORKERS, BATCHING, PORT, TEMP_DIR, BATCH_SIZE, BATCH_WAIT_S = {args}


@serve.deployment(num_replicas=WORKERS, ray_actor_options={{"num_cpus": 0}})
class Peer:
    def __init__(self) -> None:
        # Ray Serve 2.60 binds each replica's inter-deployment gRPC server on "[::]:0", hard-coded; this runs in
        # the replica before that server starts: bind it on loopback (the proxy dials the node ip, 127.0.0.1)
        from ray.serve._private import replica

        bind = replica.add_port_to_grpc_server
        replica.add_port_to_grpc_server = lambda server, address: bind(server, address.replace("[::]", "127.0.0.1"))
        self.model = joblib.load(MODEL_PATH)

    async def __call__(self, request: Request):
        if request.method == "GET":
            return {{"ready": True}}
        rows = (await request.json())["instances"]
        if BATCHING:
            return {{"predictions": await self.batched(rows)}}
        return {{"predictions": predict_rows(self.model, rows)}}

    @serve.batch(max_batch_size=BATCH_SIZE, batch_wait_timeout_s=BATCH_WAIT_S)
    async def batched(self, batches):
        return predict_batches(self.model, batches)


if __name__ == "__main__":
    ray.init(include_dashboard=False, _temp_dir=TEMP_DIR, _node_ip_address="127.0.0.1", num_cpus=os.cpu_count(),
             log_to_driver=False, configure_logging=False)
    serve.start(http_options={{"host": "127.0.0.1", "port": PORT}})
    serve.run(Peer.bind(), name="peer", route_prefix="/")
    print("peer ready", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    serve.shutdown()
    ray.shutdown()
"""


def start_rayserve(
    python: Path, model_path: Path, workdir: Path, logs: Path, *, workers: int = 2, batching: bool = False
) -> Server:
    port = loopback_port()
    temp_dir = workdir.resolve() / "ray"
    cleanup: Callable[[], None] | None = None
    if len(str(temp_dir)) > 40:  # Ray puts unix sockets under <temp>/session_<date>_<pid>/sockets: 107 bytes at most
        temp_dir = Path(tempfile.mkdtemp(prefix="tfray-", dir="/tmp"))
        cleanup = functools.partial(shutil.rmtree, temp_dir, ignore_errors=True)

    args = (str(Path(model_path).resolve()), workers, batching, port, str(temp_dir), BATCH_SIZE, BATCH_WAIT_S)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "ray_peer.py").write_text("import os\n" + ROWS_CODE + _RAY_CODE.format(args=repr(args)))
    cmd = [str(python), "ray_peer.py"]
    # SIGTERM to the driver alone: it shuts Serve and Ray down in order (a group SIGTERM kills the raylet
    # first, and the driver's serve.shutdown() then hangs); whatever is left is SIGKILLed after 20 s
    return start_process(
        "rayserve", cmd, python, workdir, logs, f"http://127.0.0.1:{port}", "/", "/", cleanup, term_root_only=True
    )


_KSERVE_CODE = '''
import logging

import kserve
from kserve import logging as klogging
from kserve.protocol.rest import server as rest_server

MODEL_PATH, WORKERS, PORT, NAME = {args}
_init = rest_server.RESTServer.__init__


def _init_loopback(self, *args, **kwargs):
    """KServe 0.21 builds uvicorn.Config(host="0.0.0.0") with no option: bind loopback, no access log."""
    _init(self, *args, **kwargs)
    self.config.host = "127.0.0.1"
    self.config.access_log = False


def _configure_logging(*args, **kwargs):
    """no per-request log lines (uvicorn's access log, KServe's timing trace), as for the other peers"""
    _configure(*args, **kwargs)
    for name in ("uvicorn.access", "kserve.trace"):
        logging.getLogger(name).disabled = True


rest_server.RESTServer.__init__ = _init_loopback
_configure, klogging.configure_logging = klogging.configure_logging, _configure_logging
_configure_logging()  # this module runs again in each spawned worker, which configures logging anew


class Peer(kserve.Model):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.model = None
        self.load()

    def load(self) -> bool:
        self.model = joblib.load(MODEL_PATH)
        self.ready = True
        return self.ready

    def predict(self, payload, headers=None):
        return {{"predictions": predict_rows(self.model, payload["instances"])}}


if __name__ == "__main__":
    kserve.ModelServer(http_port=PORT, workers=WORKERS, enable_grpc=False, enable_latency_logging=False,
                       enable_docs_url=False).start([Peer(NAME)])
'''


def start_kserve(
    python: Path, model_path: Path, workdir: Path, logs: Path, *, workers: int = 2, batching: bool = False
) -> Server:
    port = loopback_port()
    args = (str(Path(model_path).resolve()), workers, port, MODEL_NAME)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "kserve_peer.py").write_text(ROWS_CODE + _KSERVE_CODE.format(args=repr(args)))
    cmd = [str(python), "kserve_peer.py"]
    return start_process(
        "kserve",
        cmd,
        python,
        workdir,
        logs,
        f"http://127.0.0.1:{port}",
        f"/v1/models/{MODEL_NAME}",
        f"/v1/models/{MODEL_NAME}:predict",
        ready_log=("Application startup complete.", workers),
    )


_UVICORN_CODE = """
BODY = b'{"predictions":[0]}'
HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    more = True
    while more:  # read the whole body, as a real server must
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": BODY})
"""


def start_uvicorn(
    python: Path, model_path: Path, workdir: Path, logs: Path, *, workers: int = 2, batching: bool = False
) -> Server:
    port = loopback_port()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "asgi_peer.py").write_text(_UVICORN_CODE)
    cmd = [
        str(python.parent / "uvicorn"),
        "asgi_peer:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--no-access-log",
    ]
    return start_process(
        "uvicorn",
        cmd,
        python,
        workdir,
        logs,
        f"http://127.0.0.1:{port}",
        "/",
        "/",
        ready_log=("Application startup complete.", workers),
    )


STARTERS: dict[str, Callable[..., Server]] = {
    "mlserver": start_mlserver,
    "bentoml": start_bentoml,
    "rayserve": start_rayserve,
    "kserve": start_kserve,
    "uvicorn": start_uvicorn,
}
