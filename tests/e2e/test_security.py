"""Security on a real gateway process with a real replica of the champion: the admin API bound to its
own port, a rate-limited scoped token, hostile values against the real replica, and no secret in any log.
The in-process half (every route enumerated) is ``tests/integration/test_gateway_security.py``.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.gateway.process import PROJECT_DIR, environ_with, wait_endpoint_ready
from serving.replicas.local import free_port

pytestmark = pytest.mark.slow

SCOPED = "security-scoped-token-" + secrets.token_hex(8)  # may use endpoint "fraud-sec" only
LIMITED = "security-limited-token-" + secrets.token_hex(8)  # endpoint "fraud-sec", 2 requests/s, burst 4
CANARY = "CANARY-" + secrets.token_hex(6)  # planted in payloads; must never come back


class TwoPortGateway:
    def __init__(self, process: subprocess.Popen[bytes], port: int, admin_port: int, log_path: Path) -> None:
        self.process = process
        self.public = f"http://127.0.0.1:{port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        self.log_path = log_path


@pytest.fixture(scope="module")
def two_ports(world, tmp_path_factory) -> Iterator[TwoPortGateway]:  # type: ignore[no-untyped-def]
    """``python -m serving --port P --admin-port A`` with a scoped, rate-limited token and the champion served."""
    admin = os.environ["TOLLFREE_TOKEN"]
    tokens_file = tmp_path_factory.mktemp("sec-tokens") / "tokens.json"
    tokens_file.write_text(
        json.dumps(
            {
                "tokens": [
                    {"name": "app", "token": SCOPED, "endpoints": ["fraud-sec"]},
                    {
                        "name": "metered",
                        "token": LIMITED,
                        "endpoints": ["fraud-sec"],
                        "rate_limit": {"requests_per_second": 2, "burst": 4},
                    },
                ]
            }
        )
    )
    port, admin_port = free_port(), free_port()
    log_path = world.home / "logs" / "gateway-security.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = environ_with(
        {"TOLLFREE_TOKENS_FILE": str(tokens_file), "TOLLFREE_WARM_POOL": "0", "TOLLFREE_AUTOSCALE": "off"}
    )
    with open(log_path, "ab") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "serving",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--admin-port",
                str(admin_port),
                "--log-level",
                "debug",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(PROJECT_DIR),
        )
    gw = TwoPortGateway(process, port, admin_port, log_path)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log_path.read_text()[-3000:]
            try:
                if (
                    httpx.get(f"{gw.public}/healthz", timeout=1).status_code == 200
                    and httpx.get(f"{gw.admin}/healthz", timeout=1).status_code == 200
                ):
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "gateway did not come up"
            time.sleep(0.2)
        created = httpx.post(
            f"{gw.admin}/api/2.0/serving-endpoints",
            headers={"Authorization": f"Bearer {admin}"},
            json={
                "name": "fraud-sec",
                "config": {"served_entities": [{"entity_name": "fraud", "entity_alias": "champion"}]},
            },
            timeout=120,
        )
        assert created.status_code == 200, created.text
        wait_ready(gw.admin, admin, "fraud-sec")
        yield gw
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)


def wait_ready(url: str, token: str, name: str, timeout_s: float = 240.0) -> None:
    """``wait_endpoint_ready`` that tolerates a slow answer on a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            wait_endpoint_ready(url, token, name, timeout_s=max(1.0, deadline - time.monotonic()))
            return
        except httpx.TimeoutException:
            assert time.monotonic() < deadline, f"endpoint {name} not ready in {timeout_s:.0f}s"


ROW = {"dataframe_records": [{"customer_id": 17, "merchant_id": 4, "amount": 250.0}]}


def test_live_admin_api_is_bound_to_its_own_port(two_ports):
    admin = {"Authorization": f"Bearer {os.environ['TOLLFREE_TOKEN']}"}
    public, private = two_ports.public, two_ports.admin
    assert httpx.get(f"{public}/api/2.0/serving-endpoints", headers=admin).status_code == 404
    assert httpx.get(f"{public}/openapi.json", headers=admin).status_code == 404
    assert httpx.get(f"{public}/metrics", headers=admin).status_code == 404
    assert httpx.get(f"{private}/api/2.0/serving-endpoints", headers=admin).status_code == 200
    assert httpx.get(f"{private}/openapi.json").status_code == 401
    served = httpx.post(f"{public}/serving-endpoints/fraud-sec/invocations", headers=admin, json=ROW, timeout=30)
    assert served.status_code == 200 and served.headers["served-model-name"] == "fraud-champion"
    assert httpx.post(f"{public}/serving-endpoints/fraud-sec/invocations", json=ROW).status_code == 401


def test_live_rate_limit_payload_echo_and_logs(two_ports, world):
    public = two_ports.public
    limited = {"Authorization": f"Bearer {LIMITED}"}
    with httpx.Client(base_url=public, timeout=30) as client:
        codes = [client.post("/serving-endpoints/fraud-sec/invocations", headers=limited, json=ROW) for _ in range(12)]
        ok = [r for r in codes if r.status_code == 200]
        refused = [r for r in codes if r.status_code == 429]
        assert 4 <= len(ok) < 12 and len(ok) + len(refused) == 12
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        # hostile values against the real replica: errors name keys and rows (by design), never the values
        scoped = {"Authorization": f"Bearer {SCOPED}"}
        hostile = [
            {"dataframe_records": [{"customer_id": CANARY, "merchant_id": 4, "amount": 1.0}]},
            {"dataframe_records": [{"customer_id": 17, "merchant_id": 4, "amount": CANARY}]},
            {"dataframe_split": {"columns": ["customer_id", "merchant_id", "amount"], "data": [[CANARY, 4, CANARY]]}},
            {"inputs": {"customer_id": [CANARY], "merchant_id": [4], "amount": [1.0]}},
            {"instances": [[CANARY, CANARY, CANARY]]},
            {"inputs": CANARY},
        ]
        for body in hostile:
            reply = client.post("/serving-endpoints/fraud-sec/invocations", headers=scoped, json=body)
            assert 400 <= reply.status_code < 500, reply.text
            assert CANARY not in reply.text, reply.text
        raw = client.post(
            "/serving-endpoints/fraud-sec/invocations",
            headers={**scoped, "content-type": "text/csv"},
            content=f"customer_id,merchant_id\n{CANARY},{CANARY}\n",
        )
        assert 400 <= raw.status_code < 500 and CANARY not in raw.text
        too_many = {"dataframe_records": [ROW["dataframe_records"][0]] * 10_001}
        assert client.post("/serving-endpoints/fraud-sec/invocations", headers=scoped, json=too_many).status_code == 413
        client.get("/api/2.0/serving-endpoints", headers={"Authorization": "Bearer unknown-" + CANARY})
    logs = [two_ports.log_path, *sorted((world.home / "logs").glob("*.log"))]
    text = "\n".join(p.read_text(errors="replace") for p in logs)
    for secret in (os.environ["TOLLFREE_TOKEN"], SCOPED, LIMITED, "unknown-" + CANARY):
        assert secret not in text
    assert re.search(r"gateway", text)  # the logs were there to search
