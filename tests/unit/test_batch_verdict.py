"""When a batch run takes the input suite's verdict from its child process (``job._run_chunks``): between chunks
as soon as it is there, at the latest after the last chunk, and before a chunk's own error. The engine and the
child are stand-ins; the real child process is tested in tests/integration/test_validation_process.py."""

from __future__ import annotations

import pytest

from serving.batch import engines, job
from serving.batch.chunks import ChunkResult, ScoringContext
from serving.batch.input_check import BatchInputError, InputPlan, InputSpec

SPEC = InputSpec("transaction_id", ("customer_id",), ("amount",))
PLAN = InputPlan("/in", ())
CTX = ScoringContext("/home", "sqlite:///x.db", "models:/m/1", "1", None, SPEC, "r", "/staging")


class Verdict:
    """The child's side: its verdict is there after ``after`` chunks (never: None), and refuses or passes."""

    def __init__(self, after: int | None, refuse: bool) -> None:
        self.after, self.refuse = after, refuse
        self.chunks_seen = 0
        self.taken_after: list[int] = []  # chunks done each time the verdict was taken

    def ready(self) -> bool:
        return self.after is not None and self.chunks_seen >= self.after and not self.taken_after

    def verdict(self, plan: InputPlan, spec: InputSpec) -> None:
        self.taken_after.append(self.chunks_seen)
        if self.refuse:
            raise BatchInputError("batch input /in fails validation in rows 0..9: amount: 2 row(s) fail")


def _engine(monkeypatch, verdict: Verdict, chunks: int, fail_at: int | None = None) -> list[int]:
    scored: list[int] = []

    def run(engine, ctx, todo, on_done, dask=None):  # type: ignore[no-untyped-def]
        results = []
        for i in range(chunks):
            if i == fail_at:
                raise ValueError("Input X contains NaN.")
            scored.append(i)
            result = ChunkResult(i, 10, 0, ((f"part-{i}", 10),), {"read": 0.0})
            verdict.chunks_seen += 1
            on_done(result)
            results.append(result)
        return results

    monkeypatch.setattr(engines, "run", run)
    return scored


def _run(verdict: Verdict, chunks: int = 4):  # type: ignore[no-untyped-def]
    return job._run_chunks("local", CTX, [None] * chunks, None, PLAN, verdict, None, 0.0)  # type: ignore[arg-type]


def test_a_refusal_that_arrives_between_chunks_stops_the_run_there(monkeypatch):
    verdict = Verdict(after=2, refuse=True)
    scored = _engine(monkeypatch, verdict, chunks=4)
    with pytest.raises(BatchInputError, match="amount: 2 row"):
        _run(verdict)
    assert scored == [0, 1] and verdict.taken_after == [2]


def test_a_verdict_still_out_after_the_last_chunk_is_waited_for_and_a_pass_returns_every_result(monkeypatch):
    verdict = Verdict(after=None, refuse=False)
    _engine(monkeypatch, verdict, chunks=4)
    results, waited = _run(verdict)
    assert [r.index for r in results] == [0, 1, 2, 3] and verdict.taken_after == [4] and waited >= 0


def test_a_chunk_failing_on_a_refused_input_raises_the_suites_error_naming_the_column(monkeypatch):
    verdict = Verdict(after=None, refuse=True)
    _engine(monkeypatch, verdict, chunks=4, fail_at=1)
    with pytest.raises(BatchInputError, match="amount: 2 row") as caught:
        _run(verdict)
    assert isinstance(caught.value.__context__, ValueError)  # the chunk's own error stays attached
    assert verdict.taken_after == [1]


def test_a_chunk_failing_on_an_input_the_suite_passes_raises_the_chunks_error(monkeypatch):
    verdict = Verdict(after=None, refuse=False)
    _engine(monkeypatch, verdict, chunks=4, fail_at=2)
    with pytest.raises(ValueError, match="contains NaN"):
        _run(verdict)
    assert verdict.taken_after == [2]


def test_inline_validation_has_no_verdict_to_take(monkeypatch):
    _engine(monkeypatch, Verdict(after=None, refuse=True), chunks=3)
    results, waited = job._run_chunks("local", CTX, [None] * 3, None, PLAN, None, None, 0.0)  # type: ignore[arg-type]
    assert len(results) == 3 and waited >= 0
