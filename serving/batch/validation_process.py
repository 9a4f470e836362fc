"""The input's Great Expectations suite in a child process, started as a run starts.

A fresh scoring process spends ~2 s importing Great Expectations and ~0.5 s per million rows
running its suite, single-threaded, while the second core waits; its other start-up (MLflow, Feast,
the model) is single-threaded Python as well. So a run started in a fresh process starts this child at
once: the child imports Great Expectations beside the parent's own imports, then takes the input plan
and runs the very suite of ``input_check.validate_values`` while the parent loads the model and scores
into its hidden staging directory. The parent takes the verdict as soon as it is there (``ready``, between
chunks) and at the latest before it publishes: a refused input stops the run and publishes nothing.
A process that has Great Expectations loaded already (a worker that scored before, a test session)
validates inline, before any chunk: there is no import left to hide.

The child reserves its real stdout for the verdict (a pickle of a small tuple); anything a library
prints there goes to stderr. If the child cannot start, dies, or fails other than by refusing the input,
the parent validates inline (and so fails as an inline run would).
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
from typing import BinaryIO

from serving.batch.input_check import BatchInputError, InputPlan, InputSpec, validate_values

log = logging.getLogger(__name__)

MODES = ("auto", "process", "inline")


def wanted(mode: str) -> bool:
    """Whether to validate in a child process: ``process``; ``auto`` unless Great Expectations is loaded here."""
    if mode not in MODES:
        raise ValueError(f"validation must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "process" or (mode == "auto" and "great_expectations" not in sys.modules)


class ValidationProcess:
    """A child that imports Great Expectations now and validates one input later. Use as a context manager:
    leaving it stops a child whose verdict was never asked for (a run refused before validation)."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._settled = False  # the input passed: later verdict() calls return at once
        self._refused: BatchInputError | None = None  # the input failed: later calls raise it again
        try:
            self._child = subprocess.Popen(
                [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
        except OSError as exc:
            log.warning("could not start the input validation process (%s): validating inline", exc)

    def submit(self, plan: InputPlan, spec: InputSpec) -> None:
        """Hand the child the input to validate; it runs while the caller goes on."""
        if self._child is None or self._child.stdin is None:
            return
        try:
            self._child.stdin.write(pickle.dumps((plan, spec)))
            self._child.stdin.close()
        except OSError as exc:  # the child died before reading
            log.warning("the input validation process did not take the input (%s): validating inline", exc)
            self.close()

    def ready(self) -> bool:
        """Whether a verdict not taken yet can be taken without waiting for the child (it has exited, or there
        is no child: then ``verdict`` validates inline). Never blocks."""
        return not self._settled and self._refused is None and (self._child is None or self._child.poll() is not None)

    def verdict(self, plan: InputPlan, spec: InputSpec) -> None:
        """Wait for the child's verdict: return if the input passes, raise ``BatchInputError`` naming the
        problem if not; later calls give the same outcome at once. Without a verdict from the child (it failed
        to start, died, or could not read the input), validate here: the caller then gets what an inline run
        raises."""
        if self._refused is not None:
            raise self._refused
        if self._settled:
            return
        try:
            self._take(plan, spec)
        except BatchInputError as exc:
            self._refused = exc
            raise
        self._settled = True

    def _take(self, plan: InputPlan, spec: InputSpec) -> None:
        child, self._child = self._child, None
        if child is None or child.stdout is None:
            validate_values(plan, spec)
            return
        try:
            raw = child.stdout.read()
            code = child.wait()
        finally:
            _stop(child)
        try:
            outcome = pickle.loads(raw) if code == 0 and raw else None
        except (pickle.UnpicklingError, EOFError, ValueError):
            outcome = None
        kind, detail = outcome if outcome is not None else ("error", f"exited with code {code} and no verdict")
        if kind == "failed":
            raise BatchInputError(detail)
        if kind == "error":
            # no verdict (the child died, or could not read the input): validating here gives the error the
            # caller would get inline (a missing file stays a FileNotFoundError the CLI names)
            log.warning("the input validation process gave no verdict (%s): validating inline", detail)
            validate_values(plan, spec)
            return
        log.info("batch input %s: %s (in a child process)", plan.root, detail)

    def close(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            _stop(child)

    def __enter__(self) -> ValidationProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _stop(child: subprocess.Popen[bytes]) -> None:
    for stream in (child.stdin, child.stdout):
        if stream is not None and not stream.closed:
            stream.close()
    if child.poll() is None:
        child.kill()
        child.wait()


def _serve(source: BinaryIO, sink: BinaryIO) -> None:
    import great_expectations  # noqa: F401 - the import this process exists to take off the parent's path

    raw = source.read()
    if not raw:  # the parent went away (or refused the run) before handing over an input
        return
    plan, spec = pickle.loads(raw)
    try:
        seconds = validate_values(plan, spec)
        outcome = ("passed", f"{plan.rows} rows passed the input suite in {seconds:.2f} s")
    except BatchInputError as exc:
        outcome = ("failed", str(exc))
    except Exception as exc:
        outcome = ("error", f"{type(exc).__name__}: {str(exc)[:300]}")
    sink.write(pickle.dumps(outcome))
    sink.flush()


def main() -> None:
    verdict_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a library printing to stdout must not corrupt the verdict
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)  # its INFO lines are the parent's to tell
    _serve(sys.stdin.buffer, verdict_out)


if __name__ == "__main__":
    main()
