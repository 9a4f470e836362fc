"""Shadow traffic on a real gateway process: an endpoint whose champion doubles ``x`` and whose shadow (another
version, at 100 %) raises on ``x == 7`` and sleeps 3 s on ``x == 13``. Every client answer is the champion's,
on time, whatever the shadow does; the shadow's answers land in the inference log under the same request ids,
marked shadow, and nowhere a client's record is read."""

from __future__ import annotations

import time

import pytest

from serving.inference_log import read_inference_log
from tests.gateways import LiveGateway, wait_ready
from tests.models import RowCostModel, TrapModel, register_x_model
from tests.world import MODEL_NAME

pytestmark = pytest.mark.slow

ENDPOINT, MODEL = "shadowed", "shadow-x"
HANG_S = 3.0


@pytest.fixture(scope="module")
def shadowed(gateway: LiveGateway, world) -> dict:  # type: ignore[no-untyped-def]
    """The endpoint: ``x-1`` (2x) takes every request, ``x-2`` (the trap model) shadows all of them."""
    uri = world.settings.tracking_uri
    champion = register_x_model(uri, MODEL, RowCostModel(0.0), MODEL_NAME)
    shadow = register_x_model(uri, MODEL, TrapModel(HANG_S), MODEL_NAME)
    config = {
        "served_entities": [
            {"name": "x-1", "entity_name": MODEL, "entity_version": champion},
            {"name": "x-2", "entity_name": MODEL, "entity_version": shadow},
        ],
        "traffic_config": {
            "routes": [
                {"served_entity_name": "x-1", "traffic_percentage": 100},
                {"served_entity_name": "x-2", "traffic_percentage": 0, "shadow_percentage": 100},
            ]
        },
    }
    with gateway.client(gateway.admin) as http:
        created = http.post("/api/2.0/serving-endpoints", json={"name": ENDPOINT, "config": config})
        assert created.status_code == 200, created.text
    return wait_ready(gateway.url, ENDPOINT)


def test_a_failing_or_hanging_shadow_changes_no_client_answer(gateway, world, shadowed) -> None:  # type: ignore[no-untyped-def]
    routes = {r["served_entity_name"]: r for r in shadowed["config"]["traffic_config"]["routes"]}
    assert routes["x-2"]["shadow_percentage"] == 100 and routes["x-2"]["traffic_percentage"] == 0
    sent: dict[str, float] = {}
    with gateway.client(gateway.admin) as http:
        for i, x in enumerate([7.0, 13.0, 1.0, 7.0, 2.5, 13.0, 1.0, 7.0, 4.0, 2.5]):
            request_id = f"shadow-{i}"
            began = time.monotonic()
            answer = http.post(
                f"/serving-endpoints/{ENDPOINT}/invocations",
                json={"dataframe_split": {"columns": ["x"], "data": [[x]]}},
                headers={"x-request-id": request_id},
            )
            took = time.monotonic() - began
            assert answer.status_code == 200, answer.text
            assert answer.json()["predictions"] == [2 * x]
            assert answer.headers["served-model-name"] == "x-1"
            assert took < HANG_S / 2, f"the client waited {took:.1f} s: for the shadow"
            sent[request_id] = x
    folder = world.settings.inference_log_dir
    deadline = time.monotonic() + 60  # the shadow's hangs end, then the log's writer flushes
    while True:
        shadows = read_inference_log(folder, endpoint=ENDPOINT, shadow=True)
        shadows = shadows[shadows["request_id"].isin(sent)]
        if len(shadows) == len(sent) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(shadows["request_id"]) == sorted(sent)
    assert set(shadows["served_entity"]) == {"x-2"}
    by_id = shadows.set_index("request_id")
    for request_id, x in sent.items():
        status = by_id.loc[request_id, "status_code"]
        assert (status != 200) if x == 7.0 else (status == 200), (request_id, x, status)
    assert by_id.loc[[r for r, x in sent.items() if x == 13.0], "latency_ms"].min() >= HANG_S * 1000 * 0.9
    clients = read_inference_log(folder, endpoint=ENDPOINT)
    clients = clients[clients["request_id"].isin(sent)]
    assert len(clients) == len(sent) and set(clients["served_entity"]) == {"x-1"}
    assert set(clients["status_code"]) == {200}


@pytest.mark.parametrize(
    ("route", "named"),
    [
        ({"served_entity_name": "b", "traffic_percentage": 10, "shadow_percentage": 50}, "a shadow takes no traffic"),
        ({"served_entity_name": "b", "traffic_percentage": 0, "shadow_percentage": 101}, "between 0 and 100"),
    ],
)
def test_a_bad_shadow_route_is_refused_naming_it(gateway, route, named) -> None:  # type: ignore[no-untyped-def]
    config = {
        "served_entities": [
            {"name": "a", "entity_name": MODEL_NAME, "entity_alias": "champion"},
            {"name": "b", "entity_name": MODEL_NAME, "entity_alias": "champion"},
        ],
        "traffic_config": {
            "routes": [{"served_entity_name": "a", "traffic_percentage": 100 - route["traffic_percentage"]}, route]
        },
    }
    with gateway.client(gateway.admin) as http:
        refused = http.post("/api/2.0/serving-endpoints", json={"name": "bad-shadow", "config": config})
    assert refused.status_code == 400, refused.text
    assert named in refused.json()["message"] and "routes[1]" in refused.json()["message"]
