"""Which regions are healthy: each region's probe results, and the order requests try them in.

A region is down after ``fall`` failed probes or one failed request that could not reach it, and up again after
``rise`` probes in a row succeed. Requests go to the first region (in the order given: the primary first) that is
up; when none is, to every region in order anyway, so a client never refuses on its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class RegionState:
    url: str
    up: bool = True
    successes: int = 0
    failures: int = 0
    waiters: set[threading.Event] = field(default_factory=set)  # requests in flight there, woken when it goes down


class Regions:
    def __init__(self, urls: list[str], rise: int = 2, fall: int = 1) -> None:
        if not urls:
            raise ValueError("a failover client needs at least one region URL")
        urls = [url.rstrip("/") for url in urls]
        if len(set(urls)) != len(urls):
            raise ValueError("a region URL is listed twice")
        if rise < 1 or fall < 1:
            raise ValueError("rise and fall must be at least 1")
        self.states = [RegionState(url) for url in urls]
        self.rise = rise
        self.fall = fall
        self._lock = threading.Lock()

    def order(self) -> list[str]:
        """The regions a request tries, best first: the ones up in the given order, then the ones down."""
        with self._lock:
            up = [s.url for s in self.states if s.up]
            return up + [s.url for s in self.states if not s.up]

    def probed(self, url: str, ok: bool) -> None:
        with self._lock:
            state = self._state(url)
            if ok:
                state.successes, state.failures = state.successes + 1, 0
                if not state.up and state.successes >= self.rise:
                    state.up = True
            else:
                state.successes, state.failures = 0, state.failures + 1
                if state.failures >= self.fall:
                    self._down(state)

    def unreachable(self, url: str) -> None:
        """A request could not reach ``url``: down at once, until probes bring it back."""
        with self._lock:
            self._down(self._state(url))

    def _down(self, state: RegionState) -> None:
        state.up, state.successes = False, 0
        for waiter in state.waiters:
            waiter.set()

    def watch(self, url: str, waiter: threading.Event) -> bool:
        """Set ``waiter`` when ``url`` goes down; False (and nothing watched) if it is down already."""
        with self._lock:
            state = self._state(url)
            if not state.up:
                return False
            state.waiters.add(waiter)
            return True

    def unwatch(self, url: str, waiter: threading.Event) -> None:
        with self._lock:
            self._state(url).waiters.discard(waiter)

    def up(self, url: str) -> bool:
        with self._lock:
            return self._state(url).up

    def _state(self, url: str) -> RegionState:
        for state in self.states:
            if state.url == url:
                return state
        raise KeyError(url)
