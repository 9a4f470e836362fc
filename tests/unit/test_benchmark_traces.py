"""The autoscaler benchmark's real traces are in the repository, with their source and licence."""

from __future__ import annotations

from benchmarks.autoscaler_runs import TRACES, load_trace
from simulator.traces import load_csv


def test_the_azure_traces_load_from_a_clone_and_keep_their_attribution() -> None:
    assert len(load_csv(TRACES / "azure_llm_2023_code.csv").arrivals) == 8_819
    assert len(load_csv(TRACES / "azure_llm_2023_conv.csv").arrivals) == 19_366
    readme = (TRACES / "README.md").read_text()
    assert "Creative Commons Attribution 4.0" in readme and "Splitwise" in readme
    quick = load_trace("azure_conv", 0, True)  # rescaled to the benchmark's rate, its first 180 s
    assert 0 < quick.arrivals[-1] < 180 and len(quick.arrivals) > 100_000
