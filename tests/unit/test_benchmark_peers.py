"""The peers benchmark's pure parts: each server's request format, reading its answer back, the verdict against
the best peer and the table (benchmarks/peers.py, benchmarks/peer_servers.py)."""

from __future__ import annotations

import json

import pandas as pd

from benchmarks.peer_wire import predictions_of, request_for
from benchmarks.peers_models import predictions, request
from benchmarks.peers_report import table as _table
from benchmarks.peers_report import verdict as _verdict


def _model(records: bool) -> dict:
    columns = ["f0", "cat"] if records else ["f0", "f1"]
    frame = pd.DataFrame({"f0": [0.5, 1.5], "cat" if records else "f1": ["a", "b"] if records else [2.0, 3.0]})
    return {"columns": columns, "frame": frame}


def test_tollfree_and_mlflow_get_dataframe_split_and_peers_their_native_format():
    path, body, _ = request("tollfree", _model(records=False), 2)
    assert path == "" and json.loads(body) == {
        "dataframe_split": {"columns": ["f0", "f1"], "data": [[0.5, 2.0], [1.5, 3.0]]}
    }
    path, body, _ = request("kserve", _model(records=False), 1)
    assert path == "/v1/models/peer:predict" and json.loads(body) == {"instances": [[0.5, 2.0]]}
    path, body, _ = request("bentoml-batch", _model(records=True), 2)  # a variant speaks its peer's format
    assert path == "/predict" and json.loads(body)["instances"] == [{"f0": 0.5, "cat": "a"}, {"f0": 1.5, "cat": "b"}]
    path, body, _ = request_for("mlserver", [[0.5, 2.0]])
    v2 = json.loads(body)
    assert (
        path == "/v2/models/peer/infer" and v2["inputs"][0]["datatype"] == "FP64" and v2["inputs"][0]["shape"] == [1, 2]
    )


def test_answers_are_read_back_as_labels():
    assert predictions("mlflow-2w", {"predictions": [1, 0]}) == [1, 0]
    assert predictions("mlserver-batch", {"outputs": [{"data": [0, 1]}]}) == [0, 1]
    assert predictions_of("bentoml", "[1, 1]") == [1, 1]


def _row(server: str, rows: int, c: int, rps: float, p50: float) -> dict:
    return {
        "server": server,
        "rows": rows,
        "concurrency": c,
        "rps": rps,
        "rows_per_s": rps * rows,
        "p50_ms": p50,
        "p99_ms": p50 * 3,
        "errors": 0,
        "cpu_s_per_1000_predictions": 1.0,
    }


def test_the_verdict_compares_with_the_best_peer_never_with_ours_or_the_ceiling():
    rows = [
        _row("tollfree", 1, 32, 3000, 9.0),
        _row("kserve", 1, 32, 2000, 12.0),
        _row("mlserver", 1, 32, 1000, 30.0),
        _row("mlflow-2w", 1, 32, 5000, 5.0),
        _row("uvicorn", 1, 32, 30000, 0.5),
        _row("tollfree", 1, 1, 700, 1.3),
        _row("kserve", 1, 1, 1300, 0.65),
        _row("bentoml", 1, 1, 600, 1.4),
    ]
    verdict = _verdict(rows)
    assert verdict["rps_c32_over_best_peer"] == {"value": 1.5, "best_peer": "kserve", "target": 2.0, "pass": False}
    assert (
        verdict["p50_c1_over_best_peer"]["best_peer"] == "kserve" and verdict["p50_c1_over_best_peer"]["value"] == 2.0
    )
    assert "rows_per_s_32_over_best_peer" not in verdict  # no 32-row points: no claim
    # the lead at c=32 must come with a shorter tail than that peer's: 27 ms against kserve's 36 ms
    assert verdict["p99_c32_over_that_peer"] == {"value": 0.75, "best_peer": "kserve", "target": 1.0, "pass": True}
    assert "p50_c1_over_in_process_ms" not in verdict  # no in-process figure given
    assert _verdict(rows, in_process_ms=0.2)["p50_c1_over_in_process_ms"]["value"] == 1.1
    assert _verdict(rows, in_process_ms=0.2)["p50_c1_over_in_process_ms"]["pass"] is False
    table = _table(rows, {"tollfree": {"path": "fast path, batching off", "loadavg_1m_before_after": [0.1, 1.2]}})
    assert "| tollfree | fast path, batching off | 1 | 32 | 3000.0 |" in table and "| 0.10 |" in table  # 3000 / 30000


def test_an_unknown_model_or_server_is_refused_naming_it(capsys):
    import pytest

    from benchmarks.peers import _parse_args

    for argv, named in (
        (["--models", "light,huge"], "unknown model 'huge'"),
        (["--servers", "kserve,triton"], "unknown server 'triton'"),
    ):
        with pytest.raises(SystemExit):
            _parse_args(argv)
        assert named in capsys.readouterr().err
    assert "rayserve-batch" in _parse_args([]).servers


def test_repeated_rounds_become_one_median_point_each_with_their_range_and_the_verdict_reads_the_medians():
    from benchmarks.peers_report import medians

    rounds = [_row("tollfree", 1, 32, rps, 9.0) for rps in (3000, 1200, 4100)]
    rounds += [_row("kserve", 1, 32, rps, 12.0) for rps in (2000, 1900, 900)]
    points = medians(rounds)
    assert [(p["server"], p["rps"], p["rps_range"], p["rounds"]) for p in points] == [
        ("tollfree", 3000, [1200, 4100], 3),
        ("kserve", 1900, [900, 2000], 3),
    ]
    assert _verdict(points)["rps_c32_over_best_peer"]["value"] == round(3000 / 1900, 2)
    assert "3000.0 (1200-4100)" in _table(points, {})
    two = medians([_row("kserve", 1, 1, 100, 1.0), _row("kserve", 1, 1, 300, 2.0)])
    assert two[0]["rps"] == 200 and two[0]["p50_ms"] == 1.5  # an even count: the mean of the middle two
    assert "rps_range" not in medians([_row("kserve", 1, 1, 100, 1.0)])[0]


def test_each_point_gets_the_decisions_taken_during_it_and_the_median_row_the_replicas_each_round_asked():
    from benchmarks.peers_report import attach_decisions, medians, scaling_text

    def decision(t: float, replicas: int, reason: str) -> dict:
        return {
            "t": t,
            "replicas": replicas,
            "ready_replicas": 1,
            "reason": reason,
            "max_concurrency": 8,
            "inputs": {"load_up": 9.5, "target": 4.0, "cores_busy": 0.97, "unrelated": 1},
        }

    decisions = [
        decision(99.0, 1, "activation"),
        decision(101.0, 3, "scale up"),
        decision(104.0, 2, "scale up (held at 2: the machine's cores are busy)"),
        decision(120.0, 2, "within tolerance"),
    ]
    rounds = [
        {**_row("tollfree", 1, 32, 3000, 9.0), "window": [100.0, 113.0]},
        {**_row("tollfree", 1, 1, 700, 1.3), "window": [113.5, 126.5]},
    ]
    attach_decisions(rounds, decisions)
    assert [d["s"] for d in rounds[0]["decisions"]] == [1.0, 4.0] and rounds[0]["replicas_asked"] == 3
    assert rounds[0]["decisions"][1] == {
        "s": 4.0,
        "replicas": 2,
        "ready": 1,
        "load_up": 9.5,
        "target": 4.0,
        "cores_busy": 0.97,
        "reason": "scale up (held at 2: the machine's cores are busy)",
    }
    assert rounds[1]["replicas_asked"] == 2 and "window" not in rounds[1]  # the decision at 120 s
    again = [{**_row("tollfree", 1, 32, 2000, 9.0), "window": [200.0, 213.0]}]
    attach_decisions(again, [])  # no decision during the point: nothing asked
    assert again[0]["replicas_asked"] is None and again[0]["decisions"] == []
    point = medians(rounds[:1] + again)[0]
    assert point["replicas_asked_rounds"] == [3, None]
    assert "| 3/- |" in _table([point], {})
    assert scaling_text(decisions) == (
        "; autoscaler: up to 3 replica(s), limit 8 per replica at the end, held at the cores in 1 decision(s)"
    )
    assert scaling_text([]) == "; autoscaler: no decision"


def test_repeat_below_one_is_refused_naming_the_option(capsys):
    import pytest

    from benchmarks.peers import _parse_args

    with pytest.raises(SystemExit):
        _parse_args(["--repeat", "0"])
    assert "--repeat must be at least 1, got 0" in capsys.readouterr().err
    assert _parse_args(["--repeat", "3"]).repeat == 3
