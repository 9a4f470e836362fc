"""Each gateway's admission queue during the chaos soak, so that a span of 429s can be set beside the bound that
refused it: every ``EVERY_S`` each gateway's ``/metrics`` is read for the endpoint's ``tollfree_queue_limit`` (how
many requests may wait before the next is refused) and ``tollfree_queue_depth`` (how many wait). A gateway that
does not answer (killed, restarting) gives no sample for that read."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

EVERY_S = 0.5
METRICS = {"tollfree_queue_limit": "limit", "tollfree_queue_depth": "depth"}


@dataclass(frozen=True)
class QueueSample:
    at_s: float  # seconds after the load began
    gateway: int  # its port
    limit: float
    depth: float


def read_queue(text: str, endpoint: str) -> dict[str, float]:
    """``limit`` and ``depth`` of ``endpoint`` in a ``/metrics`` page, summed over its served entities (absent when
    the page has none: the endpoint is not live there)."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        key = METRICS.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.labels.get("endpoint") == endpoint:
                found[key] = found.get(key, 0.0) + sample.value
    return found


def around(samples: Sequence[QueueSample], lo_s: float, hi_s: float) -> dict[str, dict[str, float]]:
    """Per gateway (by port), the lowest limit and the deepest queue read between ``lo_s`` and ``hi_s``."""
    out: dict[str, dict[str, float]] = {}
    for s in samples:
        if lo_s <= s.at_s <= hi_s:
            seen = out.setdefault(str(s.gateway), {"min_limit": s.limit, "max_depth": s.depth})
            seen["min_limit"] = min(seen["min_limit"], s.limit)
            seen["max_depth"] = max(seen["max_depth"], s.depth)
    return dict(sorted(out.items()))


class QueueWatch:
    """Reads the gateways on ``ports`` in a thread of its own from ``start`` until ``stop``."""

    def __init__(self, ports: Sequence[int], endpoint: str, token: str, began: float) -> None:
        self.samples: list[QueueSample] = []
        self._ports, self._endpoint, self._began = list(ports), endpoint, began
        self._headers = {"Authorization": f"Bearer {token}"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-queue-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[QueueSample]:
        self._stop.set()
        self._thread.join(10)
        return self.samples

    def _run(self) -> None:
        with httpx.Client(timeout=EVERY_S * 2, headers=self._headers) as client:
            while not self._stop.is_set():
                at = time.monotonic()
                for port in self._ports:
                    try:
                        reply = client.get(f"http://127.0.0.1:{port}/metrics")
                    except httpx.HTTPError:
                        continue
                    found = read_queue(reply.text, self._endpoint) if reply.status_code == 200 else {}
                    if "limit" in found:
                        self.samples.append(
                            QueueSample(round(at - self._began, 1), port, found["limit"], found.get("depth", 0.0))
                        )
                self._stop.wait(max(0.0, EVERY_S - (time.monotonic() - at)))
