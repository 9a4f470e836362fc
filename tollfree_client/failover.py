"""A client for several regions of one tollfree service: it sends to the first healthy region and fails over.

    client = FailoverClient(["https://eu.example:8080", "https://us.example:8080"], token=TOKEN)
    answer = client.invoke("fraud", {"dataframe_records": [...]})

- A thread per region probes its ``/healthz`` each ``probe_interval_s`` (``health.Regions`` decides up and down),
  so a region that does not answer delays no other region's probes.
- A request goes to the first region that is up, the primary (first URL) whenever it is.
- A request that could not reach its region, timed out, or was answered 502, 503 or 504 is sent once more, to the
  next region, if the retry budget (``budget.RetryBudget``) allows; a region it could not reach is down at once.
  So is a request still waiting on a region when the probes find it down (a partition: its packets are lost in
  silence, and the answer would come only at the timeout): the attempt is left to end by itself, unread.
  Predictions are idempotent, so a request a region may have scored is safe to send again. Any other answer
  (a 4xx, a 429 of an overloaded region, a 500 of a model error) is returned as it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx

from tollfree_client.budget import RetryBudget
from tollfree_client.health import Regions

RETRIED_STATUSES = frozenset({502, 503, 504})


class AllRegionsFailed(RuntimeError):
    """No region answered the request (each attempt's failure is named)."""


class RegionDown(Exception):
    """The region was found down while an attempt waited on it."""


class FailoverClient:
    def __init__(
        self,
        urls: list[str],
        token: str,
        *,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        probe_interval_s: float = 0.25,
        probe_timeout_s: float = 0.5,
        rise: int = 2,
        fall: int = 1,
        budget: RetryBudget | None = None,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe: bool = True,
        max_in_flight: int = 256,
    ) -> None:
        self.regions = Regions(urls, rise=rise, fall=fall)
        self.budget = budget or RetryBudget()
        self._clock = clock
        headers = {"Authorization": f"Bearer {token}"}
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
        self._http = httpx.Client(headers=headers, timeout=timeout, limits=limits, transport=transport)
        # attempts run here, so that one left waiting on a region found down does not hold its caller
        self._attempts = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="tollfree-client")
        self._probe_timeout = httpx.Timeout(probe_timeout_s)
        self._interval = probe_interval_s
        self._stop = threading.Event()
        self._probers = [
            threading.Thread(target=self._probe_loop, args=(s.url,), name=f"tollfree-client-probe-{i}", daemon=True)
            for i, s in enumerate(self.regions.states)
            if probe
        ]
        for thread in self._probers:
            thread.start()

    def __enter__(self) -> FailoverClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._probers:
            thread.join(timeout=self._interval + 2.0)
        self._attempts.shutdown(wait=True, cancel_futures=True)
        self._http.close()

    def _probe(self, url: str) -> None:
        try:
            ok = self._http.get(f"{url}/healthz", timeout=self._probe_timeout).status_code == 200
        except httpx.HTTPError:
            ok = False
        self.regions.probed(url, ok)

    def probe_once(self) -> None:
        """Probe every region's ``/healthz`` once (the probe threads do this every interval)."""
        for state in self.regions.states:
            self._probe(state.url)

    def _probe_loop(self, url: str) -> None:
        while not self._stop.wait(self._interval):
            self._probe(url)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """``method path`` on the first healthy region, once more on the next one if it failed as a region fails."""
        self.budget.sent(self._clock())
        failures: list[str] = []
        order = self.regions.order()
        for attempt, url in enumerate(order[:2]):
            if attempt and not self.budget.try_retry(self._clock()):
                failures.append("no retry: the retry budget is spent")
                break
            try:
                reply = self._attempt(url, method, path, kwargs)
            except RegionDown:
                failures.append(f"{url}: down while the request waited")
                continue
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                self.regions.unreachable(url)
                failures.append(f"{url}: {type(exc).__name__}")
                continue
            except httpx.TimeoutException as exc:
                failures.append(f"{url}: {type(exc).__name__}")
                continue
            if reply.status_code in RETRIED_STATUSES and attempt + 1 < min(2, len(order)):
                failures.append(f"{url}: {reply.status_code}")
                continue
            return reply
        raise AllRegionsFailed(f"{method} {path}: " + "; ".join(failures))

    def _attempt(self, url: str, method: str, path: str, kwargs: dict[str, Any]) -> httpx.Response:
        """One attempt on ``url``: its answer, or ``RegionDown`` as soon as the region is found down meanwhile."""
        wake = threading.Event()
        # a region found down already (every one is, or it is the last one left) is tried all the same, waited for
        if not self.regions.watch(url, wake):
            return self._http.request(method, f"{url}{path}", **kwargs)
        try:
            future: Future[httpx.Response] = self._attempts.submit(self._http.request, method, f"{url}{path}", **kwargs)
            future.add_done_callback(lambda _: wake.set())
            wake.wait()
            if not future.done():
                raise RegionDown(url)
            return future.result()
        finally:
            self.regions.unwatch(url, wake)

    def invoke(self, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
        """Score ``body`` on ``endpoint`` (the MLflow scoring protocol); the answer's JSON, or ``httpx``'s
        ``HTTPStatusError`` for an answer that is not 200."""
        reply = self.request("POST", f"/serving-endpoints/{endpoint}/invocations", json=body)
        reply.raise_for_status()
        result: dict[str, Any] = reply.json()
        return result
