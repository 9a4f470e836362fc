"""The gateway-to-replica hop alone: one envelope of one request, HTTP against frames on the replica's Unix socket.

    python -m benchmarks.hop [--calls 5000] [--json]

A server process answers ``POST /invocations/batch`` on uvicorn (uvloop, httptools: the replica's HTTP
server) and frame calls on a ``FrameListener`` (the replica's frame socket), both with the same fixed answer
envelope and no model; the gateway's ``ReplicaClient`` sends one call at a time, first over HTTP only
(``_post``, the HTTP path alone), then through ``send``, which goes in frames once the
first answer named the socket. Prints the p50 and p90 round trip and the client's CPU per call (this
process's user + system time over the calls), the gateway's share of the hop's cost; ``--json``, the
same as one object with the run's provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import Provenance

ANSWER = b'{"items":[[200,1,3,0]]}\n[1]'


class _Busy:
    def total(self) -> float:
        return 0.0


class _FixedAnswer:
    """What the frame socket scores with: the fixed answer, no model."""

    class metrics:
        busy = _Busy()

    def score_inline(self, envelope: bytes) -> bytes:
        return ANSWER

    async def score_threaded(self, envelope: bytes) -> bytes:
        return ANSWER


def serve(port: int, address: str) -> None:
    import uvicorn

    from serving.protocol import frames, wire
    from serving.replica_server.frames_server import FrameListener

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", wire.CONTENT_TYPE.encode()),
                    (b"content-length", str(len(ANSWER)).encode()),
                    (wire.BUSY_HEADER.encode(), b"0.0"),
                    (frames.ADDRESS_HEADER.encode(), address.encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": ANSWER})

    async def main() -> None:
        listener = FrameListener(_FixedAnswer, "bench-token")
        await listener.start(address)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_level="warning",
            access_log=False,
            loop="uvloop",
            http="httptools",
            lifespan="off",
        )
        await uvicorn.Server(config).serve()

    import uvloop

    uvloop.run(main())


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _measure(url: str, calls: int) -> dict[str, dict[str, float]]:
    from serving.protocol.wire import WireRequest, encode_requests
    from serving.replicas.client import ReplicaClient

    client = ReplicaClient("bench-token")
    await client.start()
    replica = type("Replica", (), {"url": url})()
    requests = [WireRequest("r", "application/json", b'{"dataframe_split":{"columns":["a"],"data":[[1.0]]}}')]
    envelope = encode_requests(requests)
    ways = {"http": lambda: client._post(url, envelope), "frames": lambda: client.send(replica, requests)}
    out = {}
    try:
        for name, call in ways.items():
            for _ in range(max(100, calls // 10)):  # warm-up (and, for frames, the first call learns the socket)
                await call()
            took = []
            cpu = _cpu_s()
            for _ in range(calls):
                started = time.perf_counter()
                await call()
                took.append(time.perf_counter() - started)
            cpu = _cpu_s() - cpu
            took.sort()
            out[name] = {
                "p50_us": statistics.median(took) * 1e6,
                "p90_us": took[int(len(took) * 0.9)] * 1e6,
                "client_cpu_us_per_call": cpu / calls * 1e6,
            }
        assert client._connections, "the frame socket was never used"
    finally:
        await client.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hop", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    parser.add_argument("--serve", nargs=2, metavar=("PORT", "ADDRESS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls must be at least 1 (got {args.calls})")
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    from serving.replicas.local import free_port

    port = free_port()
    address = f"unix:@tollfree-bench-hop/{os.getpid()}"
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.hop", "--serve", str(port), address])
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.post(f"http://127.0.0.1:{port}/invocations/batch", content=b"", timeout=1.0)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the hop server did not start") from None
                time.sleep(0.05)
        import uvloop

        provenance = Provenance("benchmarks.hop", argv)
        result = uvloop.run(_measure(f"http://127.0.0.1:{port}", args.calls))
    finally:
        server.terminate()
        server.wait(timeout=10)
    record = provenance.record()
    if args.json:
        print(json.dumps({**record, "calls": args.calls, "hops": result}, indent=1))
        return 0
    print(f"{record['command']}; {record['date']}; 1-min load average before {record['loadavg_before'][0]:.2f}")
    print("| hop | p50 round trip | p90 | gateway (client) CPU per call |\n| --- | ---: | ---: | ---: |")
    for name, row in result.items():
        print(f"| {name} | {row['p50_us']:.0f} us | {row['p90_us']:.0f} us | {row['client_cpu_us_per_call']:.0f} us |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
