"""Waiting for a condition with a deadline, never for a fixed time: a fixed sleep either waits longer than the
condition needs or, on a busy machine, not long enough."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(check: Callable[[], T], what: str, timeout_s: float = 10.0, every_s: float = 0.01) -> T:
    """``check()`` once it is true (polled every ``every_s``); AssertionError naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(every_s)
    return result


async def until_async(check: Callable[[], T], what: str, timeout_s: float = 10.0, every_s: float = 0.005) -> T:
    """:func:`until` inside an event loop: the loop runs (and the code under test with it) between the polls."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(every_s)
    return result
