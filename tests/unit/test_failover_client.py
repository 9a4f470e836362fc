"""The failover client against regions simulated by httpx's MockTransport, with the clock passed in."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from tollfree_client import AllRegionsFailed, FailoverClient, RetryBudget
from tollfree_client.health import Regions

A, B = "http://a.test", "http://b.test"


class FakeRegions:
    """Each region's behaviour by URL: "ok", "down" (cannot connect), "slow" (times out), or a status code."""

    def __init__(self) -> None:
        self.mode = {A: "ok", B: "ok"}
        self.seen: list[str] = []
        self.released = threading.Event()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        region = f"{request.url.scheme}://{request.url.host}"
        mode = self.mode[region]
        if request.url.path != "/healthz":
            self.seen.append(region)
        if mode == "down":
            raise httpx.ConnectError("refused", request=request)
        if mode == "slow":
            raise httpx.ReadTimeout("timed out", request=request)
        if mode == "silent":  # a partition: no answer until the test lets it go
            self.released.wait(10)
            raise httpx.ReadTimeout("timed out", request=request)
        if isinstance(mode, int):
            return httpx.Response(mode, json={"error_code": "X"})
        return httpx.Response(200, json={"predictions": [region]})


def _client(regions: FakeRegions, budget: RetryBudget | None = None, now: list[float] | None = None) -> FailoverClient:
    clock = now or [0.0]
    return FailoverClient(
        [A, B], "t", transport=httpx.MockTransport(regions), probe=False, budget=budget, clock=lambda: clock[0]
    )


def test_requests_go_to_the_primary_while_it_is_healthy():
    regions = FakeRegions()
    with _client(regions) as client:
        assert [client.invoke("fraud", {})["predictions"][0] for _ in range(3)] == [A, A, A]


def test_a_region_that_cannot_be_reached_fails_over_at_once_and_the_primary_comes_back_after_rise_probes():
    regions = FakeRegions()
    with _client(regions) as client:
        regions.mode[A] = "down"
        assert client.invoke("fraud", {})["predictions"] == [B]  # retried on B
        assert client.invoke("fraud", {})["predictions"] == [B]  # straight to B: A is down
        assert regions.seen == [A, B, B]
        regions.mode[A] = "ok"
        client.probe_once()
        assert client.invoke("fraud", {})["predictions"] == [B]  # one good probe is not enough
        client.probe_once()
        assert client.invoke("fraud", {})["predictions"] == [A]


@pytest.mark.parametrize("mode", ["slow", 503, 502, 504])
def test_a_timeout_or_a_gateway_error_is_sent_once_more_to_the_next_region(mode):
    regions = FakeRegions()
    regions.mode[A] = mode
    with _client(regions) as client:
        assert client.invoke("fraud", {})["predictions"] == [B]
        assert regions.seen == [A, B]


@pytest.mark.parametrize("status", [400, 404, 429, 500])
def test_other_answers_are_the_answer(status):
    regions = FakeRegions()
    regions.mode[A] = status
    with _client(regions) as client:
        assert client.request("POST", "/serving-endpoints/fraud/invocations", json={}).status_code == status
        assert regions.seen == [A]


def test_a_failure_in_every_region_names_each_and_the_last_regions_503_is_returned():
    regions = FakeRegions()
    regions.mode[A] = regions.mode[B] = "down"
    with _client(regions) as client, pytest.raises(AllRegionsFailed, match=r"a.test: ConnectError; .*b.test: Conn"):
        client.invoke("fraud", {})
    regions.mode[A] = regions.mode[B] = 503
    with _client(regions) as client:
        assert client.request("GET", "/x").status_code == 503


def test_the_retry_budget_stops_retries_beyond_its_share():
    now = [0.0]
    regions = FakeRegions()
    regions.mode[A] = "slow"  # times out: never marked down, every request tries A first
    with _client(regions, RetryBudget(ratio=0.1, min_per_s=0.1, window_s=10), now) as client:
        answered = failed = 0
        for _ in range(100):
            try:
                client.invoke("fraud", {})
                answered += 1
            except AllRegionsFailed as exc:
                assert "retry budget" in str(exc)
                failed += 1
        assert answered == 11 and failed == 89  # 1 a second over 10 s, plus 10 % of 100
        now[0] = 20.0  # the window has passed: retries are allowed again
        assert client.invoke("fraud", {})["predictions"] == [B]


def test_budget_and_regions_refuse_bad_settings():
    with pytest.raises(ValueError, match="ratio"):
        RetryBudget(ratio=2)
    with pytest.raises(ValueError, match="at least one region"):
        Regions([])
    with pytest.raises(ValueError, match="twice"):
        Regions([A, A + "/"])


def test_the_client_imports_nothing_of_the_stack():
    stack = "{'serving', 'flows', 'mlflow', 'pandas', 'prefect', 'feast'}"
    code = f"import sys, tollfree_client; print(sorted({{m.split('.')[0] for m in sys.modules}} & {stack}))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_a_request_waiting_on_a_region_found_down_is_sent_to_the_next_at_once():
    regions = FakeRegions()
    regions.mode[A] = "silent"
    with _client(regions) as client:
        answers: list[dict] = []
        caller = threading.Thread(target=lambda: answers.append(client.invoke("fraud", {})))
        caller.start()
        deadline = time.monotonic() + 5
        while regions.seen != [A] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not answers  # waiting on A
        client.regions.probed(A, ok=False)  # the probes find A down (fall 1)
        caller.join(timeout=5)
        assert answers == [{"predictions": [B]}] and regions.seen == [A, B]
        regions.released.set()


def test_when_every_region_is_down_each_is_still_tried_in_order():
    regions = FakeRegions()
    with _client(regions) as client:
        client.regions.unreachable(A)
        client.regions.unreachable(B)
        assert client.invoke("fraud", {})["predictions"] == [A]
