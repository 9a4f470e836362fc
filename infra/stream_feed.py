"""The local stack's demo stream: ``python -m infra.stream_feed`` (``make up`` runs it as the ``stream-feed`` service).

It appends the demo's transactions (``customer_id``, ``merchant_id``, ``amount``, as strings: what a producer
writes to a stream) to the stream ``transactions`` on the stack's redis-server, at ``TOLLFREE_STREAM_RATE``
events a second (default 5; 0 appends nothing), looping over the rows. The stream is trimmed to about
``MAX_ENTRIES`` entries (``XADD MAXLEN ~``): at the default rate, days of history.

It also attaches the stream to the endpoint ``TOLLFREE_STREAM_ENDPOINT`` (default ``fraud``, the demo's; empty:
attach nowhere) once that endpoint exists: a stream input reading ``transactions`` with the group ``tollfree``
and writing to ``scores`` and ``transactions-dead``, added to the endpoint's config through the
serving-endpoints API (the rest of its config as it is). It checks again every ``CHECK_S`` seconds, so an
endpoint created later (``make demo``, the deploy flow) gets it too; an endpoint that already reads the
stream is left alone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import redis
from redis.typing import EncodableT, FieldT

log = logging.getLogger("tollfree.stream_feed")

SOURCE, SINK, DEAD = "transactions", "scores", "transactions-dead"
MAX_ENTRIES = 1_000_000
CHECK_S = 2.0  # one GET of the endpoint while it is not attached: nothing for the gateway
COLUMNS = ("customer_id", "merchant_id", "amount")


def stream_input(redis_url: str) -> dict[str, Any]:
    return {
        "source": f"{redis_url}/{SOURCE}",
        "sink": f"{redis_url}/{SINK}",
        "dead_letter": f"{redis_url}/{DEAD}",
        "group": "tollfree",
    }


def with_stream(config: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any] | None:
    """The PUT body that adds ``wanted`` to an endpoint's ``config`` (as the API shows it), or None when an
    input already reads its source."""
    inputs = list(config.get("stream_inputs") or [])
    if any(s.get("source") == wanted["source"] for s in inputs):
        return None
    entities = []
    for shown in config.get("served_entities", []):
        entity = {k: v for k, v in shown.items() if k != "state"}
        if "entity_alias" in entity:
            entity.pop("entity_version", None)  # the alias's resolved version: the alias stays what is asked for
        entities.append(entity)
    routes = [
        {"served_entity_name": r["served_entity_name"], "traffic_percentage": r["traffic_percentage"]}
        for r in config.get("traffic_config", {}).get("routes", [])
    ]
    return {"served_entities": entities, "traffic_config": {"routes": routes}, "stream_inputs": [*inputs, dict(wanted)]}


def attach(api: httpx.Client, endpoint: str, wanted: Mapping[str, Any]) -> bool:
    """Add the stream input to ``endpoint`` if it exists, is not updating and lacks it; True once it has it."""
    view = api.get(f"/api/2.0/serving-endpoints/{endpoint}")
    if view.status_code == 404:
        return False
    view.raise_for_status()
    body = view.json()
    if body.get("state", {}).get("config_update") == "IN_PROGRESS":
        return False
    put = with_stream(body.get("config", {}), wanted)
    if put is None:
        return True
    answer = api.put(f"/api/2.0/serving-endpoints/{endpoint}/config", json=put)
    if answer.status_code != 200:
        log.warning(
            "attaching the stream to endpoint %s: %s", endpoint, answer.json().get("message", answer.status_code)
        )
        return False
    log.info("endpoint %s now reads %s", endpoint, wanted["source"])
    return True


def rows(home: Path) -> list[dict[FieldT, EncodableT]]:
    """The events to append, each a dict of strings (typed as XADD takes its fields)."""
    from feature_repo import synthetic

    frame = synthetic.read_transactions(home / "data")[list(COLUMNS)]
    return [
        {"customer_id": str(int(c)), "merchant_id": str(int(m)), "amount": repr(float(a))}
        for c, m, a in frame.itertuples(index=False)
    ]


def feed(environ: Mapping[str, str]) -> None:
    home = Path(environ["TOLLFREE_HOME"])
    port = int(environ.get("TOLLFREE_REDIS_PORT", "6380"))
    rate = float(environ.get("TOLLFREE_STREAM_RATE", "5"))
    endpoint = environ.get("TOLLFREE_STREAM_ENDPOINT", "fraud")
    client = redis.Redis(host="127.0.0.1", port=port)
    wanted = stream_input(f"redis://127.0.0.1:{port}")
    api = httpx.Client(
        base_url=environ["TOLLFREE_GATEWAY_URL"],
        timeout=10,
        headers={"Authorization": f"Bearer {environ['TOLLFREE_TOKEN']}"},
    )
    events = rows(home)
    attached, next_check, at, started = not endpoint, 0.0, 0, time.monotonic()
    log.info("feeding %s at %.1f events/s to redis://127.0.0.1:%d/%s", SOURCE, rate, port, SOURCE)
    while True:
        now = time.monotonic()
        if not attached and now >= next_check:
            next_check = now + CHECK_S
            try:
                attached = attach(api, endpoint, wanted)
            except (httpx.HTTPError, ValueError) as exc:
                log.info("gateway not answering yet (%s)", type(exc).__name__)
        due = int((now - started) * rate) - at if rate > 0 else 0
        if due > 0:
            pipe = client.pipeline(transaction=False)
            for i in range(at, at + due):
                pipe.xadd(SOURCE, events[i % len(events)], maxlen=MAX_ENTRIES, approximate=True)
            try:
                pipe.execute()
                at += due
            except redis.RedisError as exc:  # the broker restarts: the pace catches up once it is back
                log.warning("appending failed (%s)", type(exc).__name__)
        time.sleep(min(1.0, 1 / rate) if rate > 0 else 1.0)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    feed(os.environ)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
