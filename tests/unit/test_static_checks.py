"""The linters the project keeps clean: ``ruff check``, ``ruff format --check`` and mypy, each with the
configuration in pyproject.toml, run from the repository root with the virtual environment's executables.

mypy keeps its cache in .mypy_cache/ at the root (gitignored): a clean clone's first run checks everything, later
runs only what changed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("args", [("ruff", "check", "."), ("ruff", "format", "--check", ".")], ids=["lint", "format"])
def test_ruff_finds_nothing(args: tuple[str, ...]) -> None:
    done = run(*args)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}{done.stderr}"


def test_mypy_finds_nothing() -> None:
    # the packages it checks are the `files` of [tool.mypy] in pyproject.toml
    done = run("mypy")
    assert done.returncode == 0, f"mypy failed:\n{done.stdout}{done.stderr}"
