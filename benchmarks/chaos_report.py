"""The chaos soak's result: figures from the load's outcomes, the faults done and the stream's counts (``figures``,
pure), and the text printed at the end (``render``).

A fault's window runs from the fault until ``WINDOW_AFTER_S`` after what it hit was back (a replica kill ends at
once; a gateway or PostgreSQL once it answers again): a request sent inside a window counts as sent during faults.
Latency percentiles are over the answers 200 (nearest rank); every other outcome is a failure: an answer other than
200, no answer (a client error or a timeout), or a request not sent because the generator already had its bound in
flight. The failed requests are also grouped by when they were sent (``failure_spans``), so failures outside every
window show too, each span with the gateways' admission queues read around it (``benchmarks.chaos_watch``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from benchmarks.chaos_faults import Fault
from benchmarks.chaos_stream import StreamFigures
from benchmarks.chaos_watch import QueueSample, around
from benchmarks.common import percentile
from benchmarks.load import LoadResult, Outcome

WINDOW_AFTER_S = 10.0
SPAN_GAP_S = 5.0  # failures sent closer together than this are one span
NOT_SENT = "not sent (bound in flight)"


def windows(faults: Sequence[Fault]) -> list[tuple[float, float]]:
    """Each fault's window, in seconds after the load began."""
    return [(f.at_s, f.ended_s + WINDOW_AFTER_S) for f in faults]


def _ms(seconds: float) -> float | None:
    return None if seconds != seconds else round(seconds * 1000, 1)  # NaN (no answer 200): None


def _failures(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.status != 200:
            key = str(o.status) if o.status is not None else f"error:{o.error}"
            key += f" ({o.reason})" if o.reason else ""
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))


def _p99(outcomes: Sequence[Outcome]) -> float | None:
    return _ms(percentile((o.latency_s for o in outcomes if o.status == 200), 99))


def failure_spans(outcomes: Sequence[Outcome], began: float) -> list[dict[str, float]]:
    """When the failed requests were sent: spans of failures no more than ``SPAN_GAP_S`` apart, each with its
    first and last send time (seconds after the load began) and its count; for failures outside every fault's
    window too."""
    spans: list[dict[str, float]] = []
    for t in sorted(o.started - began for o in outcomes if o.status != 200):
        if spans and t - spans[-1]["last_s"] <= SPAN_GAP_S:
            spans[-1]["last_s"], spans[-1]["count"] = round(t, 1), spans[-1]["count"] + 1
        else:
            spans.append({"first_s": round(t, 1), "last_s": round(t, 1), "count": 1})
    return spans


def figures(
    load: LoadResult,
    began: float,
    faults: Sequence[Fault],
    stream: StreamFigures,
    offered: dict[str, Any],
    queues: Sequence[QueueSample] = (),
) -> dict[str, Any]:
    """The run's figures and verdict. ``began``: when the load began (monotonic seconds, the clock of the outcomes'
    ``started``); ``queues``: the gateways' queues as read during the load. Passed: no failure, no stream event
    lost or doubled, and every fault done."""
    spans = windows(faults)

    def sent_in(lo: float, hi: float) -> list[Outcome]:
        return [o for o in load.outcomes if lo <= o.started - began <= hi]

    during = {id(o): o for lo, hi in spans for o in sent_in(lo, hi)}.values()
    failures = _failures(load.outcomes)
    if load.skipped:
        failures[NOT_SENT] = load.skipped
    rows = []
    for fault, (lo, hi) in zip(faults, spans):
        inside = sent_in(lo, hi)
        rows.append({**asdict(fault), "requests": len(inside), "failures": _failures(inside), "p99_ms": _p99(inside)})
    ok = [o.latency_s for o in load.outcomes if o.status == 200]
    failed = sum(failures.values())
    return {
        "offered": offered,
        "requests": len(load.outcomes),
        "answered_200": len(ok),
        "failures": failed,
        "failures_by_status": failures,
        "p50_ms": _ms(percentile(ok, 50)),
        "p99_ms": _ms(percentile(ok, 99)),
        "max_ms": _ms(max(ok, default=float("nan"))),
        "requests_during_faults": len(during),
        "p99_during_faults_ms": _p99(list(during)),
        "faults": rows,
        "failure_spans": [
            {**span, "queues": around(queues, span["first_s"] - 1.0, span["last_s"] + 1.0)}
            for span in failure_spans(load.outcomes, began)
        ],
        "stream": asdict(stream),
        "passed": failed == 0 and stream.lost == 0 and stream.doubled == 0 and all(f.error is None for f in faults),
    }


def _fault_line(row: dict[str, Any]) -> str:
    failed = sum(row["failures"].values())
    outcome = f"ERROR {row['error']}" if row["error"] else row["target"]
    return (
        f"  {row['at_s']:6.1f} s  {row['kind']:<8} back at {row['ended_s']:6.1f} s  {outcome}; window: "
        f"{row['requests']} requests, {failed} failed{' ' + str(row['failures']) if failed else ''}, "
        f"p99 {row['p99_ms']} ms"
    )


def _queues(span: dict[str, Any]) -> str:
    read = span.get("queues") or {}
    return (
        "".join(f"; gateway :{port} limit {q['min_limit']:g}, depth {q['max_depth']:g}" for port, q in read.items())
        or "; no gateway read"
    )


def render(report: dict[str, Any]) -> str:
    """The printed result: the load, the failures, the latencies, each fault, the stream, the verdict."""
    offered, stream = report["offered"], report["stream"]
    lines = [
        f"chaos soak: {offered['minutes']:g} min through HAProxy over {offered['gateways']} gateways, endpoint on "
        f"{offered['replicas']} replicas; open loop at {offered['rate_rps']} req/s "
        f"({'fixed;' if offered['load'] is None else format(offered['load'], '.0%') + ' of'} "
        f"{offered['capacity_rps']} req/s measured, {offered['rows']} rows a request); seed {offered['seed']}",
        f"requests: {report['requests']}; answered 200: {report['answered_200']}; failures: {report['failures']}"
        + (f" {report['failures_by_status']}" if report["failures"] else ""),
        f"latency (200s): p50 {report['p50_ms']} ms, p99 {report['p99_ms']} ms, max {report['max_ms']} ms; "
        f"during faults ({report['requests_during_faults']} requests): p99 {report['p99_during_faults_ms']} ms",
        *(
            [
                "failed requests by when they were sent (and each gateway's lowest queue limit and deepest queue "
                "read around them):",
                *(f"  {s['first_s']}-{s['last_s']} s: {s['count']}{_queues(s)}" for s in report["failure_spans"]),
            ]
            if report["failure_spans"]
            else []
        ),
        f"faults ({len(report['faults'])}; window: from the fault until {WINDOW_AFTER_S:.0f} s after what it hit "
        "was back):",
        *(_fault_line(row) for row in report["faults"]),
        f"stream ({offered['stream_rate']:g} events/s): produced {stream['produced']}, scored {stream['scored']}, "
        f"lost {stream['lost']}, doubled {stream['doubled']} (dead letters {stream['dead_letters']}, append errors "
        f"{stream['append_errors']}; drained {stream['drained_s']} s after the load)",
        "PASS" if report["passed"] else "FAIL",
    ]
    if "command" in report:  # where the result came from (``benchmarks.common.Provenance``)
        lines.insert(
            0,
            f"{report['command']}: {report['date']}, commit {report['commit']}, {report['seconds']} s; "
            f"{report['cpus']} CPUs, load average {report['loadavg_before']} before, {report['loadavg_after']} after",
        )
    return "\n".join(lines)
