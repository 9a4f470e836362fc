"""``benchmarks.hop`` runs end to end: both ways answer, the frame socket is used, and it prints its table."""

from __future__ import annotations

import pytest

from benchmarks import hop


def test_the_hop_benchmark_measures_http_and_frames(capsys):
    assert hop.main(["--calls", "200"]) == 0
    out = capsys.readouterr().out
    assert "| http |" in out and "| frames |" in out and "python -m benchmarks.hop --calls 200" in out


def test_a_call_count_below_one_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        hop.main(["--calls", "0"])
    assert "--calls must be at least 1 (got 0)" in capsys.readouterr().err
