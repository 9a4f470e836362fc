"""What several benchmarks share."""

from __future__ import annotations

import sys


def log(message: str) -> None:
    """A progress line on stderr (stdout is kept for the result)."""
    print(message, file=sys.stderr, flush=True)
