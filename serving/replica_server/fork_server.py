"""``python -m serving.replica_server.fork_server``: the process a gateway forks its local replicas from.

A replica process spends most of its start importing the runtime it needs before it loads a model (MLflow and
its SQLAlchemy store, scikit-learn, skops, Feast, uvicorn): about 4.7 CPU-seconds on a 2-core machine. The
fork server imports all that once, then forks a replica for each request of its gateway, and
the child runs exactly what ``python -m serving.replica_server`` runs after its imports. The idea of gunicorn's
``--preload`` and of the standard library's ``multiprocessing`` forkserver; not the latter itself, because its
children are its parent's workers (joined or terminated when it exits), while a replica outlives a crashed
gateway until the next one adopts it.

Protocol, one JSON line each way: the fork server writes ``{"ready": true}`` once its imports are done; then
each ``{"args": [...], "log": PATH}`` on its stdin (the replica's command-line arguments and its log file) is
answered with ``{"pid": N}`` on its stdout, or ``{"error": "..."}``. The end of its stdin (its gateway exited,
or died) ends it; the replicas it forked live on, each watching its owner (``replica.owner``).

The fork server itself never starts a thread, a loop or a model, so what a child inherits is imported modules;
the native threads the imports start (OpenBLAS's and pyarrow's jemalloc's) register their own fork handlers.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import IO, Any

from serving.replica_server.imports import import_runtime, skip_feast_type_checks

log = logging.getLogger("serving.replica_server.fork_server")


def _reap(_signum: int, _frame: Any) -> None:
    """Collect every replica that ended (no zombies) and log how."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        log.info("replica pid %d ended (code %s)", pid, os.waitstatus_to_exitcode(status))


def _retitle(title: str) -> None:
    """The child's command line, what ps, the gateway's adoption check (``replicas.local.is_replica_process``)
    and operators look for. Written over the fork server's own arguments only (SPT_NOENV, set before anything
    imported setproctitle), which end with room for it, so /proc/PID/environ still reads its environment."""
    import setproctitle

    setproctitle.setproctitle(title)
    os.environ.pop("SPT_NOENV", None)  # not the replica's own setting


def _child(run: Callable[[list[str]], int], args: list[str], log_path: str, protocol: tuple[int, int]) -> None:
    """In the forked child: become what ``python -m serving.replica_server ARGS`` would be, run it, and exit."""
    code = 1
    try:
        os.setsid()  # its own process group: a gateway stops it with killpg, as one it spawned
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the fork server's own handlers are not the replica's
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for fd in protocol:
            os.close(fd)
        out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(devnull)
        _retitle(" ".join([sys.executable, "-m", "serving.replica_server", *args]))
        logging.root.handlers.clear()  # the replica configures its own logging
        code = run(args)
    except SystemExit as exc:  # argparse's errors, or a sys.exit in the replica
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what an interpreter runs at its exit (MLflow's queued traces, ...)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve(run: Callable[[list[str]], int], requests: IO[bytes], answers: IO[bytes]) -> None:
    protocol = (requests.fileno(), answers.fileno())
    for line in requests:
        try:
            request = json.loads(line)
            args, log_path = [str(a) for a in request["args"]], str(request["log"])
        except (ValueError, KeyError, TypeError) as exc:
            answer: dict[str, Any] = {"error": f"bad request: {type(exc).__name__}"}
        else:
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                answer = {"error": f"fork failed: {exc.strerror}"}
            else:
                if pid == 0:
                    _child(run, args, log_path, protocol)  # never returns
                answer = {"pid": pid}
                log.info("forked replica pid %d: %s", pid, " ".join(args))
        answers.write(json.dumps(answer).encode() + b"\n")
        answers.flush()


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s fork-server[%(process)d] %(name)s: %(message)s"
    )
    # the protocol keeps stdin and stdout; anything else a library prints goes to the log (stderr)
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    signal.signal(signal.SIGCHLD, _reap)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # it ends with its gateway's pipe, not with a terminal's ^C
    # setproctitle keeps to the argument area (Feast's import of gunicorn sets it up before any child retitles)
    os.environ["SPT_NOENV"] = "1"
    skip_feast_type_checks()
    import_runtime()
    from serving.replica_server.__main__ import main as replica_main

    # what the imports made goes to the collector's permanent generation: a child's collections then never
    # write to those pages, so they stay shared with the fork server instead of being copied (gc.freeze's doc)
    gc.freeze()
    answers.write(b'{"ready": true}\n')
    answers.flush()
    log.info("ready: the replica runtime is imported")
    _serve(replica_main, requests, answers)
    log.info("its gateway closed the pipe: exiting (the replicas it forked live on)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
