"""Chat streams: what the gateway adds to a replica's TTFT and inter-token latency; what the external-model
proxy relays.

    python -m benchmarks.generative [--streams 1,100,500] [--seconds 20] [--proxy-interval-s 0|none] [--out PATH]

A temp ``TOLLFREE_HOME``, the ticker (benchmarks/ticker_chat.py), a replica started here, a gateway with ``chat``
(the ticker) and ``proxy`` (an external model: the gateway's own OpenAI route for ``chat``); per N, a closed loop of N
streams from a load client of its own against (a) the replica, (b) ``chat``, (c) ``proxy``.
See docs/benchmarks/generative.md.
Prints the markdown table; ``--out`` also writes the JSON result (provenance, every row, the verdicts).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.batch_setup import log
from benchmarks.common import Provenance
from benchmarks.generative_client import client_main
from benchmarks.generative_report import TARGET_STREAMS, per_token_us, summarize, table, verdicts
from benchmarks.generative_stack import Stack, targets

PROMPT = "tick tock"


def run_one(
    stack: Stack, args: argparse.Namespace, n: int, path: str, label: str, url: str, headers: dict[str, str]
) -> dict[str, Any]:
    """N streams against one path in ``--clients`` client processes; the row of the table."""
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": args.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    k, start_at, pids, load = min(args.clients, n), time.time() + 2.0, stack.pids(), os.getloadavg()
    procs = []
    for i in range(k):
        spec = {
            "url": url,
            "headers": headers,
            "body": body,
            "streams": n // k + (i < n % k),
            "start_at": start_at,
            "warm_s": args.warmup_s,
            "seconds": args.seconds,
            "ramp_s": min(args.warmup_s, 1.0),
            "drain_s": 30.0,
            "max_tokens": args.max_tokens,
            "pids": pids if i == 0 else {},
        }
        (file := stack.home / f"client-{i}.json").write_text(json.dumps({**spec, "out": str(file) + ".out"}))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.generative", "--client", str(file)], start_new_session=True
            )
        )
    stack.children += procs
    for proc in procs:
        if proc.wait(timeout=args.warmup_s + args.seconds + 120) != 0:
            raise RuntimeError(f"a load client exited with code {proc.returncode}")
    parts = [json.loads((stack.home / f"client-{i}.json.out").read_text()) for i in range(k)]
    row = {"n": n, "path": path, "label": label, "loadavg_before": [round(x, 2) for x in load], **summarize(parts)}
    cpu_s = parts[0]["servers_cpu_s"]
    row["cores"] = {role: round(s / row["window_s"], 2) for role, s in cpu_s.items()}
    row["us_per_token"] = per_token_us(
        cpu_s | {"client": sum(p["cpu_s"] for p in parts)}, row["tokens_per_s"] * row["window_s"]
    )
    log(f"N={n} {label}: {json.dumps({key: v for key, v in row.items() if key not in ('n', 'path', 'label')})}")
    return row


def versions() -> dict[str, str]:
    """The Python packages the figures depend on."""
    from importlib.metadata import version

    return {p: version(p) for p in ("aiohttp", "uvicorn", "uvloop", "mlflow")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    stack, rows = Stack(args), []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a SIGTERM cleans up as Ctrl-C does
    try:
        stack.start()
        for n in args.streams:
            for path in targets(stack, args):
                time.sleep(args.pause_s)  # each run starts on a machine at rest
                rows.append(run_one(stack, args, n, *path))
    finally:
        stack.stop()
        signal.signal(signal.SIGTERM, previous)
    at = TARGET_STREAMS if TARGET_STREAMS in args.streams else max(args.streams)  # other N: the gateway's figures
    return {
        "rows": rows,
        "verdicts": verdicts(rows, at)
        + [
            {**v, "of_record": False}
            for n in args.streams
            if n != at
            for v in verdicts(rows, n)
            if "tokens/s" not in v["target"]
        ],
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return client_main(argv[1])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.generative", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streams",
        default="1,100,500",
        type=lambda s: [int(x) for x in s.split(",")],
        help="concurrent streams, one run per value and path",
    )
    for flag, default, what in (
        ("--max-tokens", 50, "max_tokens of every request"),
        ("--seconds", 20.0, "measured seconds per run"),
        ("--warmup-s", 3.0, "seconds of load before the measured part"),
        ("--pause-s", 7.0, "idle seconds before each run"),
        ("--interval-s", 0.02, "the ticker's seconds between tokens"),
        ("--clients", 1, "load-client processes"),
    ):
        parser.add_argument(flag, type=type(default), default=default, help=what + " (default %(default)s)")
    parser.add_argument(
        "--proxy-interval-s",
        default="0",
        type=lambda s: None if s == "none" else float(s),
        help="an extra proxy row with the ticker at this interval (its ceiling); none: no extra row",
    )
    parser.add_argument(
        "--paths", type=lambda s: s.split(","), help="only these of replica,gateway,proxy,proxy-ceiling"
    )
    parser.add_argument("--out", help="write the JSON result here")
    parser.add_argument("--keep-home", action="store_true", help="keep the temp TOLLFREE_HOME (logs) at the end")
    args = parser.parse_args(argv)
    provenance = Provenance("benchmarks.generative", argv)
    result = run(args)
    report = {**provenance.record(), "run": {"versions": versions(), "args": vars(args)}, **result}
    print(table(report["rows"], report["verdicts"]))
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0 if all(v["pass"] for v in report["verdicts"] if v.get("of_record", True)) else 1


if __name__ == "__main__":
    sys.exit(main())
