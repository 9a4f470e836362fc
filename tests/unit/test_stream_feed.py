"""The demo feed's config change: it adds its stream input to an endpoint's config as the API shows it, keeps
the rest (an alias stays an alias), and leaves an endpoint that already reads the stream alone."""

from __future__ import annotations

from infra.stream_feed import stream_input, with_stream

SHOWN = {
    "served_entities": [
        {
            "name": "fraud-champion",
            "entity_name": "fraud",
            "entity_alias": "champion",
            "entity_version": "3",
            "workload_size": "Small",
            "scale_to_zero_enabled": False,
            "min_replicas": 1,
            "state": {"deployment": "DEPLOYMENT_READY"},
        },
        {
            "name": "fraud-2",
            "entity_name": "fraud",
            "entity_version": "2",
            "workload_size": "Small",
            "scale_to_zero_enabled": False,
            "state": {"deployment": "DEPLOYMENT_READY"},
        },
    ],
    "served_models": [],
    "traffic_config": {
        "routes": [
            {"served_entity_name": "fraud-champion", "served_model_name": "fraud-champion", "traffic_percentage": 90},
            {"served_entity_name": "fraud-2", "served_model_name": "fraud-2", "traffic_percentage": 10},
        ]
    },
    "config_version": 4,
}


def test_the_stream_input_is_added_and_the_rest_of_the_config_kept():
    wanted = stream_input("redis://127.0.0.1:6380")
    body = with_stream(SHOWN, wanted)
    assert body is not None
    first, second = body["served_entities"]
    assert first == {
        "name": "fraud-champion",
        "entity_name": "fraud",
        "entity_alias": "champion",
        "workload_size": "Small",
        "scale_to_zero_enabled": False,
        "min_replicas": 1,
    }
    assert second["entity_version"] == "2" and "state" not in second
    assert body["traffic_config"]["routes"] == [
        {"served_entity_name": "fraud-champion", "traffic_percentage": 90},
        {"served_entity_name": "fraud-2", "traffic_percentage": 10},
    ]
    assert body["stream_inputs"] == [
        {
            "source": "redis://127.0.0.1:6380/transactions",
            "sink": "redis://127.0.0.1:6380/scores",
            "dead_letter": "redis://127.0.0.1:6380/transactions-dead",
            "group": "tollfree",
        }
    ]


def test_an_endpoint_that_reads_the_stream_already_is_left_alone():
    wanted = stream_input("redis://127.0.0.1:6380")
    assert with_stream({**SHOWN, "stream_inputs": [{**wanted, "batch_size": 10}]}, wanted) is None
