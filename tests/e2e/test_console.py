"""The console on a real gateway process: sign-in and its cookie, what each token sees (nothing without one, only
its endpoints with a scoped one), the live event stream of an endpoint under traffic, the security headers, and
the traffic split set from it reaching the API's view."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from tests.gateways import ENTITY, LiveGateway, create, rows_body, wait_ready

pytestmark = pytest.mark.slow

NAME = "fraud-console"


@pytest.fixture(scope="module", autouse=True)
def endpoint(gateway: LiveGateway) -> None:
    """The module's endpoint on the session's gateway (its scoped token may use only the endpoint "other");
    deleted after the module as every module's are."""
    create(gateway.process, NAME, ENTITY)
    wait_ready(gateway.url, NAME)


def _row(overview: dict) -> dict:
    return next(row for row in overview["endpoints"] if row["name"] == NAME)


@contextmanager
def _signed_in(url: str, token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=30) as client:
        answer = client.post("/console/sign-in", data={"token": token})
        assert answer.status_code == 303 and answer.headers["location"] == "/console/", answer.text
        cookie = answer.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie, cookie
        yield client


def _events(client: httpx.Client, path: str, kind: str, until, timeout_s: float = 60.0) -> dict:  # type: ignore[no-untyped-def]
    """The first ``kind`` event of the stream at ``path`` whose data passes ``until``."""
    deadline = time.monotonic() + timeout_s
    with client.stream("GET", path, timeout=timeout_s) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                event = line.removeprefix("event: ")
            elif line.startswith("data: ") and event == kind:
                data = json.loads(line.removeprefix("data: "))
                if until(data):
                    return data
            assert time.monotonic() < deadline, f"no {kind} event as wanted within {timeout_s:.0f} s"
    raise AssertionError(f"the stream at {path} ended without the {kind} event wanted")


def test_without_a_known_token_nothing_is_shown_but_the_sign_in_page(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        page = anonymous.get("/console/")
        assert page.status_code == 303 and page.headers["location"] == "/console/sign-in"
        for path in ("/console/api/endpoints", "/console/api/events", f"/console/api/endpoints/{NAME}/events"):
            answer = anonymous.get(path)
            assert answer.status_code == 401 and NAME not in answer.text, (path, answer.text)
        sign_in = anonymous.get("/console/sign-in")
        assert sign_in.status_code == 200 and 'name="token"' in sign_in.text
        wrong = anonymous.post("/console/sign-in", data={"token": "not-a-token-of-this-gateway"})
        assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
        forged = anonymous.get("/console/api/endpoints", cookies={"tollfree_console": "forged-value-of-some-length"})
        assert forged.status_code == 401


def test_a_scoped_token_sees_only_its_endpoints(gateway):
    with _signed_in(gateway.url, gateway.scoped) as client:
        shown = [row["name"] for row in client.get("/console/api/endpoints").json()["endpoints"]]
        assert NAME not in shown and set(shown) <= {"other"}
        assert client.get(f"/console/api/endpoints/{NAME}").status_code == 404
        assert client.get(f"/console/api/endpoints/{NAME}/events").status_code == 404
        assert client.get(f"/console/endpoints/{NAME}").status_code == 404
        refused = client.post(
            f"/console/api/endpoints/{NAME}/traffic", headers={"x-tollfree-console": "1"}, json={"routes": []}
        )
        assert refused.status_code == 404


def test_the_pages_allow_only_their_own_scripts(gateway):
    with _signed_in(gateway.url, gateway.admin) as client:
        for path in ("/console/", f"/console/endpoints/{NAME}"):
            page = client.get(path)
            assert page.status_code == 200
            policy = page.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "default-src 'none'" in policy and "unsafe-inline" not in policy
            assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), "an inline script"
            assert not re.search(r"\son\w+=", page.text), "an inline event handler"
            for asset in re.findall(r'(?:src|href)="(/console/static/[^"]+)"', page.text):
                assert client.get(asset).status_code == 200, asset


def test_an_endpoint_under_traffic_streams_its_points_and_its_split_is_set_from_the_console(world, gateway):
    admin = gateway.admin
    stop = threading.Event()
    body = rows_body(world)

    def traffic() -> None:
        with httpx.Client(timeout=30, headers={"Authorization": f"Bearer {admin}"}) as http:
            while not stop.is_set():
                http.post(
                    f"{gateway.url}/serving-endpoints/{NAME}/invocations",
                    content=body,
                    headers={"content-type": "application/json"},
                )
                stop.wait(0.05)

    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        with _signed_in(gateway.url, admin) as client:
            row = _row(client.get("/console/api/endpoints").json())
            assert row["ready"] == "READY" and row["ready_replicas"] >= 1
            entity = row["entities"][0]["name"]
            tick = _events(
                client,
                f"/console/api/endpoints/{NAME}/events?after=0",
                "tick",
                lambda d: sum(p["requests"] for p in d["points"].get(entity, [])) > 0,
            )
            points = tick["points"][entity]
            assert all(p["ready"] >= 1 and p["desired"] >= 1 for p in points)
            assert [p["t"] for p in points] == sorted({p["t"] for p in points})
            assert tick["replicas"] and tick["replicas"][0]["alive"]
            overview = _events(client, "/console/api/events", "endpoints", lambda d: _row(d)["requests_per_s"] > 0)
            assert _row(overview)["error_ratio"] == 0.0

            split = {"routes": [{"served_model_name": entity, "traffic_percentage": 100}]}
            unmarked = client.post(f"/console/api/endpoints/{NAME}/traffic", json=split)
            assert unmarked.status_code == 403  # no X-Tollfree-Console: what a cross-site form would send
            bad = client.post(
                f"/console/api/endpoints/{NAME}/traffic",
                headers={"x-tollfree-console": "1"},
                json={"routes": [{"served_model_name": entity, "traffic_percentage": "all"}]},
            )
            assert bad.status_code == 400 and "traffic_percentage" in bad.json()["message"]
            done = client.post(
                f"/console/api/endpoints/{NAME}/traffic", headers={"x-tollfree-console": "1"}, json=split
            )
            assert done.status_code == 200, done.text
    finally:
        stop.set()
        sender.join(30)
    view = wait_ready(gateway.url, NAME)
    routes = view["config"]["traffic_config"]["routes"]  # what the SDK's get returns
    assert [(r["served_model_name"], r["traffic_percentage"]) for r in routes] == [(entity, 100)]


def test_the_last_monitoring_runs_findings_are_flagged_and_shown(world, gateway):
    from datetime import UTC, datetime

    from serving.endpoints.monitoring_results import results_file, save_latest

    summary = {
        "endpoint": NAME,
        "verdict": "findings",
        "findings": [f"drift {NAME}/1: amount"],
        "rows": 400,
        "versions": {"fraud/1": {"rows": 400, "drift_share": 0.25, "drifted": ["amount"], "report": "/r.html"}},
    }
    save_latest(world.home, summary, datetime.now(UTC))
    try:
        with _signed_in(gateway.url, gateway.admin) as client:
            flags = _row(client.get("/console/api/endpoints").json())["flags"]
            assert "the last monitoring run found 1 (skew or drift)" in flags, flags
            shown = client.get(f"/console/api/endpoints/{NAME}").json()["monitoring"]
            assert shown["findings"] == summary["findings"] and shown["versions"]["fraud/1"]["drifted"] == ["amount"]
    finally:
        results_file(world.home, NAME).unlink()


def test_bad_input_gets_a_clear_error(gateway):
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        large = anonymous.post("/console/sign-in", data={"token": "x" * 5000})
        assert large.status_code == 413 and "too large" in large.text and "x" * 100 not in large.text
    with _signed_in(gateway.url, gateway.admin) as client:
        after = client.get(f"/console/api/endpoints/{NAME}/events", params={"after": "yesterday"})
        assert after.status_code == 400 and "after must be a number" in after.json()["message"]
        unknown = client.get("/console/api/endpoints/no-such-endpoint")
        assert unknown.status_code == 404 and "no-such-endpoint" in unknown.json()["message"]
