"""``tollfree-edge``: serve a bundle on this device, and follow home's rollouts when given a home.

    tollfree-edge --folder DIR --public-key KEY.pem --token-file TOKEN [--port 8080] [--bundle FILE]
                  [--home URL --device ID --device-token-file FILE] [--poll-s 5] [--telemetry-limit N]

``--bundle`` installs a bundle file from disk (offline install) and serves it; without it the bundle last served
from ``DIR`` is served again. With ``--home`` the agent polls home for the desired bundle, reports its status and
uploads telemetry. Tokens are read from files, never from the command line (a process list shows arguments).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tollfree_edge.agent import Agent, Home
from tollfree_edge.bundle import BundleRefused, load_public_key
from tollfree_edge.server import EdgeServer
from tollfree_edge.slots import Slots
from tollfree_edge.telemetry import Telemetry


def _token(path: Path, what: str) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise SystemExit(f"{what}: cannot read {path} ({type(exc).__name__})") from None
    if not token:
        raise SystemExit(f"{what}: {path} is empty")
    return token


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tollfree-edge", description=__doc__.split("\n\n")[0])
    parser.add_argument("--folder", type=Path, required=True, help="the device's state: bundles, telemetry")
    parser.add_argument("--public-key", type=Path, required=True, help="PEM Ed25519 key bundles must be signed by")
    parser.add_argument("--token-file", type=Path, required=True, help="the bearer token local callers send")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--bundle", type=Path, help="a bundle file to install and serve")
    parser.add_argument("--home", help="the gateway's URL to poll for rollouts")
    parser.add_argument("--device", help="this device's id at home")
    parser.add_argument("--device-token-file", type=Path, help="the device's token at home")
    parser.add_argument("--poll-s", type=float, default=5.0)
    parser.add_argument("--telemetry-limit", type=int, default=100_000, help="records kept while home is away")
    args = parser.parse_args(argv)
    if args.home and not (args.device and args.device_token_file):
        parser.error("--home needs --device and --device-token-file")
    try:
        key = load_public_key(args.public_key)
    except ValueError as exc:
        parser.error(str(exc))
    args.folder.mkdir(parents=True, exist_ok=True)
    telemetry = Telemetry(args.folder / "telemetry.db", args.telemetry_limit)
    server = EdgeServer((args.host, args.port), _token(args.token_file, "--token-file"), telemetry)
    device_token = _token(args.device_token_file, "--device-token-file") if args.home else ""
    home = Home(args.home or "", args.device or "", device_token)
    agent = Agent(home, Slots(args.folder, key), server, telemetry, poll_s=args.poll_s)
    agent.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        if args.bundle:
            failed = agent.take(args.bundle)
            if failed:
                print(f"tollfree-edge: {args.bundle}: {failed}", file=sys.stderr)
                if agent.version is None:
                    return 2
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        print(f"tollfree-edge: serving {agent.version or 'nothing yet'} on {server.url}", flush=True)
        if args.home:
            agent.run(stop)
        else:
            stop.wait()
        return 0
    finally:
        server.shutdown()
        server.server_close()
        telemetry.close()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BundleRefused as exc:
        sys.exit(f"tollfree-edge: {exc}")
