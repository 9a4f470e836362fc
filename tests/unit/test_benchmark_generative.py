"""The generative benchmark's pure parts (benchmarks/generative_client.py, benchmarks/generative_report.py):
percentiles, server-sent events cut and classified, TTFT and ITL from a stream's recorded timeline, the
clients' results merged, the verdicts and the markdown table. No process is started here."""

from __future__ import annotations

import math
import os
import time

import orjson

from benchmarks.common import percentile
from benchmarks.generative_client import event_kind, machine_busy_s, proc_cpu_s, split_events, stream_figures
from benchmarks.generative_report import per_token_us, summarize, table, verdicts


def _chunk(content: str | None = None, **extra: object) -> bytes:
    delta = {} if content is None else {"content": content}
    return orjson.dumps(
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}], **extra}
    )


def test_percentile_is_the_nearest_rank():
    assert percentile(range(1, 101), 50) == 50
    assert percentile(reversed(range(1, 101)), 99) == 99
    assert percentile([10] * 990 + list(range(50, 60)), 99) == 10
    assert percentile([1, 2], 99) == 2
    assert math.isnan(percentile([], 50))


def test_split_events_keeps_an_unfinished_event_for_the_next_read():
    datas, rest = split_events(b'data: {"a":1}\n\ndata: [DONE]\n\ndata: {"b"')
    assert datas == [b'{"a":1}', b"[DONE]"] and rest == b'data: {"b"'
    datas, rest = split_events(rest + b":2}\n\n")
    assert datas == [b'{"b":2}'] and rest == b""
    assert split_events(b": a comment\n\nevent: x\n\n") == ([], b"")
    assert split_events(b"data:[DONE]\n\n") == ([b"[DONE]"], b"")


def test_event_kinds():
    assert event_kind(b"[DONE]") == "done"
    assert event_kind(_chunk("tick")) == "token"
    assert event_kind(_chunk(" tock")) == "token"
    assert event_kind(_chunk("")) == "other"  # a role-only or empty delta is no token
    assert event_kind(_chunk()) == "other"
    assert event_kind(orjson.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 50}})) == "other"
    assert (
        event_kind(orjson.dumps({"error": {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "broke off"}}))
        == "error"
    )
    assert event_kind(b"not json") == "other"
    assert event_kind(b"[1, 2]") == "other"


def test_ttft_and_itl_from_a_timeline():
    sent = 100.0
    timeline = [
        (100.001, "other"),
        (100.021, "token"),
        (100.041, "token"),
        (100.041, "token"),
        (100.070, "token"),
        (100.071, "other"),
        (100.071, "done"),
    ]
    fig = stream_figures(sent, timeline)
    assert math.isclose(fig["ttft"], 0.021)
    assert [round(x, 6) for x in fig["itl"]] == [0.02, 0.0, 0.029]  # two tokens in one read: a gap of 0
    assert fig["tokens"] == 4 and fig["done"] and fig["errors"] == 0


def test_a_stream_that_broke_off_is_not_done():
    fig = stream_figures(1.0, [(1.02, "token"), (1.04, "error")])
    assert not fig["done"] and fig["errors"] == 1 and fig["itl"] == [] and fig["tokens"] == 1
    empty = stream_figures(1.0, [])
    assert empty == {"ttft": None, "itl": [], "tokens": 0, "done": False, "errors": 0}
    assert not stream_figures(1.0, [(1.1, "done"), (1.2, "token")])["done"]  # [DONE] must be the last event


def _part(ttft: list[float], itl: list[float], **extra: object) -> dict:
    base = {
        "streams": len(ttft),
        "completed": len(ttft),
        "dropped": 0,
        "errors": 0,
        "short": 0,
        "tokens": 1000,
        "failures": {},
        "ttft_ms": ttft,
        "itl_ms": itl,
        "window_s": 10.0,
        "cpu_s": 2.0,
        "loop_lag_p99_ms": 1.5,
    }
    return {**base, **extra}


def test_summarize_merges_the_clients():
    merged = summarize(
        [
            _part([20.0, 22.0], [20.0] * 150),
            _part([24.0], [21.0] * 47 + [40.0] * 3, dropped=2, failures={"502": 2}, loop_lag_p99_ms=3.0),
        ]
    )
    assert merged["streams"] == 3 and merged["dropped"] == 2 and merged["failures"] == {"502": 2}
    assert merged["ttft_ms"] == [22.0, 24.0]
    assert merged["itl_ms"] == [20.0, 40.0]  # over all 200 gaps: the 198th is one of the other client's three 40s
    assert merged["tokens_per_s"] == 200.0 and merged["client_cores"] == 0.4 and merged["loop_lag_p99_ms"] == 3.0


def _row(n: int, path: str, ttft99: float, itl99: float, tokens_s: float = 1000.0, dropped: int = 0) -> dict:
    return {
        "n": n,
        "path": path,
        "label": path,
        "streams": 10,
        "dropped": dropped,
        "errors": 0,
        "ttft_ms": [ttft99 / 2, ttft99],
        "itl_ms": [20.0, itl99],
        "tokens_per_s": tokens_s,
        "client_cores": 0.1,
        "loop_lag_p99_ms": 1.0,
        "cores": {"replicas": 0.5, "gateway": 0.2, "machine": 0.9},
        "us_per_token": {"replicas": 50.0, "gateway": 20.0},
    }


def test_verdicts_compare_the_gateway_with_the_replica_at_n():
    rows = [
        _row(500, "replica", 30.0, 21.0),
        _row(500, "gateway", 34.9, 23.5),
        _row(500, "proxy", 40.0, 24.0, 21_000),
        _row(500, "proxy-ceiling", 9.0, 1.0, 19_000),
        _row(1, "replica", 1.0, 1.0),
        _row(1, "gateway", 9.0, 1.0),
    ]
    found = {v["target"]: v for v in verdicts(rows, 500)}
    assert found["gateway adds <= 5 ms p99 TTFT at 500 streams"]["pass"]
    assert "+4.9 ms" in found["gateway adds <= 5 ms p99 TTFT at 500 streams"]["figure"]
    assert not found["gateway adds <= 2 ms p99 ITL at 500 streams"]["pass"]  # +2.5 ms
    assert found["no stream dropped at 500 streams"]["pass"]
    assert found["proxy relays >= 20,000 tokens/s at 500 streams"]["pass"]
    assert not found["proxy ceiling (ticker at 0 ms, extra) relays >= 20,000 tokens/s at 500 streams"]["pass"]
    at_one = {v["target"]: v for v in verdicts(rows, 1)}
    assert not at_one["gateway adds <= 5 ms p99 TTFT at 1 streams"]["pass"]
    assert len(at_one) == 3  # no proxy row at N=1: no proxy verdict


def test_a_faster_gateway_passes_and_a_drop_fails():
    rows = [
        _row(500, "replica", 30.0, 21.0),
        _row(500, "gateway", 29.0, 20.0),
        _row(500, "proxy", 40.0, 24.0, 25_000, dropped=1),
    ]
    found = {v["target"]: v for v in verdicts(rows, 500)}
    assert found["gateway adds <= 5 ms p99 TTFT at 500 streams"]["pass"]
    assert "-1.0 ms" in found["gateway adds <= 5 ms p99 TTFT at 500 streams"]["figure"]
    assert not found["no stream dropped at 500 streams"]["pass"]
    assert "proxy 1 dropped" in found["no stream dropped at 500 streams"]["figure"]
    assert not found["proxy relays >= 20,000 tokens/s at 500 streams"]["pass"]  # a dropped stream fails it too


def test_table_renders_every_row_and_marks_the_verdicts():
    rows = [_row(100, "replica", 30.0, 21.0), _row(100, "gateway", 31.0, 21.5)]
    checks = verdicts(rows, 100)
    text = table(rows, [checks[0], {**checks[1], "pass": False}, {**checks[0], "of_record": False}])
    lines = text.splitlines()
    assert lines[0].startswith("| N | path |") and lines[1].startswith("| --- |")
    assert lines[2] == (
        "| 100 | replica | 10 (0 / 0) | 15.0 / 30.0 | 20.0 / 21.0 | 1,000 | 0.10 / 0.50 / 0.20 (0.90) | "
        "50.0 / 20.0 | 1.0 |"
    )
    assert "- **PASS** gateway adds <= 5 ms p99 TTFT at 100 streams: +1.0 ms" in text
    assert "- **FAIL** gateway adds <= 2 ms p99 ITL at 100 streams" in text
    assert "- **info: met** gateway adds <= 5 ms p99 TTFT" in text


def test_cpu_per_token_and_from_proc():
    assert per_token_us({"gateway": 0.5, "replicas": 2.0}, 10_000) == {"gateway": 50.0, "replicas": 200.0}
    assert per_token_us({"gateway": 0.5}, 0) == {"gateway": None}
    assert proc_cpu_s(os.getpid()) > 0
    assert proc_cpu_s(2**22 + 1) == 0.0  # above pid_max: no such process
    assert 0 < machine_busy_s() < time.monotonic() * (os.cpu_count() or 1) + 1
