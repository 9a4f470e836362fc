"""A retry budget: retries may add at most a share of the requests sent, so a dead region never doubles the load.

As Finagle's ``RetryBudget``: each request deposits ``ratio`` of a retry, each retry withdraws one, deposits
expire after ``window_s``; ``min_per_s`` retries a second are allowed whatever the traffic, so a quiet client can
still fail over. The clock is passed in.
"""

from __future__ import annotations

import threading
from collections import deque


class RetryBudget:
    def __init__(self, ratio: float = 0.2, min_per_s: float = 10.0, window_s: float = 10.0) -> None:
        if not 0.0 <= ratio <= 1.0 or min_per_s < 0 or window_s <= 0:
            raise ValueError("retry budget: ratio in [0, 1], min_per_s >= 0 and window_s > 0")
        self.ratio = ratio
        self.min_per_s = min_per_s
        self.window_s = window_s
        self._requests: deque[float] = deque()
        self._retries: deque[float] = deque()
        self._lock = threading.Lock()

    def _expire(self, now: float) -> None:
        for times in (self._requests, self._retries):
            while times and times[0] <= now - self.window_s:
                times.popleft()

    def sent(self, now: float) -> None:
        """A request was sent (a first attempt)."""
        with self._lock:
            self._expire(now)
            self._requests.append(now)

    def try_retry(self, now: float) -> bool:
        """Whether a retry may be sent now; if so it is counted."""
        with self._lock:
            self._expire(now)
            allowed = self.min_per_s * self.window_s + self.ratio * len(self._requests)
            if len(self._retries) + 1 > allowed:
                return False
            self._retries.append(now)
            return True
