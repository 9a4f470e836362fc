from __future__ import annotations

import pytest

from serving.autoscaler.config import ScalingConfig, ScalingConfigError


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"min_replicas": 5, "max_replicas": 2}, "min_replicas"),
        ({"initial_target": -1.0}, "initial_target"),
        ({"min_target": -2.0}, "min_target"),
        ({"provisioned_concurrency": -1}, "provisioned_concurrency"),
        ({"latency_slo_ms": 0}, "latency_slo_ms"),
        ({"vertical_metrics": ["latency", "gpu_temperature"]}, "vertical_metrics"),
        ({"vertical_metrics": "latency"}, "vertical_metrics"),
        ({"replicas_please": 3}, "replicas_please"),
        ({"max_replicas": "ten"}, "max_replicas"),
        ({"scale_to_zero": "yes"}, "scale_to_zero"),
        ({"min_replicas": 0}, "min_replicas"),  # 0 only with scale_to_zero
        ({"min_target": 10.0, "max_target": 5.0}, "min_target"),
        ({"target_utilisation": 1.5}, "target_utilisation"),
        ({"tolerance": float("nan")}, "tolerance"),
    ],
)
def test_a_bad_config_is_refused_naming_the_field(data, field):
    with pytest.raises(ScalingConfigError) as info:
        ScalingConfig.from_mapping(data)
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_a_good_config_round_trips_and_defaults_are_valid():
    config = ScalingConfig.from_mapping(
        {
            "min_replicas": 0,
            "scale_to_zero": True,
            "max_replicas": 20,
            "vertical_metrics": ["latency", "queue"],
            "latency_slo_ms": 250,
        }
    )
    assert config.min_replicas == 0 and config.scale_to_zero
    assert config.vertical_metrics == ("latency", "queue")
    assert ScalingConfig().max_replicas >= ScalingConfig().min_replicas


def test_not_a_mapping_is_refused():
    with pytest.raises(ScalingConfigError) as info:
        ScalingConfig.from_mapping(["min_replicas", 1])  # type: ignore[arg-type]
    assert info.value.field == "autoscaling"


def test_a_removed_field_is_refused_saying_what_replaced_it():
    with pytest.raises(ScalingConfigError) as info:
        ScalingConfig.from_mapping({"up_tolerance": 0.1})
    assert info.value.field == "up_tolerance"
    assert "no longer a setting" in str(info.value) and "forecast" in str(info.value)


def test_the_starting_target_is_what_a_replica_predicts_at_once_unless_the_user_set_one():
    from serving.autoscaler.policy import max_concurrency_for, seeded

    batched = seeded(ScalingConfig(), 32)  # a batched replica predicts its batch of 32 at once
    assert batched.initial_target == 32 and max_concurrency_for(batched, 32) == 48  # and admits half a batch more
    assert seeded(ScalingConfig(), 1).initial_target == 1  # an unbatched one, a request at a time
    assert seeded(ScalingConfig(initial_target=8.0), 32).initial_target == 8.0
    assert seeded(ScalingConfig(vertical=False), 32).initial_target == ScalingConfig().initial_target
    assert seeded(ScalingConfig(max_target=16.0), 32).initial_target == 16.0
