"""An endpoint's ``monitoring`` settings: refused with a 400 naming the field, kept and shown as given."""

from __future__ import annotations

import pytest

from serving.endpoints.monitoring_settings import CanaryThresholds, DriftConfig, overridden
from serving.endpoints.spec import EndpointCoreConfig
from serving.endpoints.validation import keep_extensions, normalize_config
from serving.endpoints.views import config_view
from serving.protocol.errors import ApiError


def config(monitoring: dict) -> EndpointCoreConfig:
    return normalize_config(
        EndpointCoreConfig.model_validate(
            {"served_entities": [{"entity_name": "m", "entity_version": "1"}], "monitoring": monitoring}
        )
    )


def test_settings_are_kept_and_shown_with_their_defaults():
    view = config_view(
        config(
            {
                "drift": {"numeric_threshold": 0.001},
                "canary": {"min_requests": 50},
                "reference": {"first_requests": 200},
            }
        ),
        1,
        {},
    )
    shown = view["monitoring"]
    assert shown["enabled"] is True and shown["window_hours"] == 24.0 and shown["min_rows"] == 50
    assert shown["drift"] == {"numeric_threshold": 0.001} and shown["canary"] == {"min_requests": 50}
    assert shown["reference"] == {"first_requests": 200, "first_hours": 1.0}
    assert "monitoring" not in config_view(
        normalize_config(
            EndpointCoreConfig.model_validate({"served_entities": [{"entity_name": "m", "entity_version": "1"}]})
        ),
        1,
        {},
    )


@pytest.mark.parametrize(
    "monitoring, named",
    [
        ({"drift": {"numeric_treshold": 0.3}}, "monitoring.drift: unknown drift setting(s): numeric_treshold"),
        (
            {"drift": {"correction": "bh"}},
            "monitoring.drift: drift setting correction must be one of holm, bonferroni, none",
        ),
        ({"drift": {"drift_share": 1.5}}, "monitoring.drift: drift setting drift_share must be between 0 and 1"),
        (
            {"drift": {"numeric_threshold": 0.25}},
            "numeric_threshold 0.25 is the false-alarm rate of ks (a p-value method): "
            "between 0 and 0.1; for a distance set numeric_method too, e.g. psi",
        ),
        ({"canary": {"min_requests": 1.5}}, "monitoring.canary: canary threshold min_requests must be an integer"),
        ({"canary": {"require_labels": 1}}, "canary threshold require_labels must be true or false"),
        ({"reference": {"start": "2026-12-01T00:00:00Z"}}, "monitoring.reference: set both start and end"),
        ({"reference": {"start": "2026-12-01T00:00:00", "end": "2026-12-02T00:00:00"}}, "need a time zone"),
        ({"reference": {"start": "2026-12-02T00:00:00Z", "end": "2026-12-01T00:00:00Z"}}, "start must be before end"),
        ({"reference": {"dataset": "d", "start": "2026-12-01T00:00:00Z", "end": "2026-12-02T00:00:00Z"}}, "not both"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(monitoring, named):
    with pytest.raises(ApiError) as refused:
        config(monitoring)
    assert refused.value.status_code == 400 and named in refused.value.message


def test_overridden_keeps_defaults_and_accepts_an_integer_for_a_number():
    assert (
        overridden(DriftConfig, {"numeric_method": "psi", "numeric_threshold": 1}, "drift setting").numeric_threshold
        == 1
    )
    assert overridden(CanaryThresholds, None, "canary threshold") == CanaryThresholds()
    with pytest.raises(ValueError, match="must be a finite number"):
        overridden(DriftConfig, {"drift_share": float("nan")}, "drift setting")


def test_an_update_without_the_block_keeps_it_and_null_removes_it():
    current = config({"enabled": False})
    entities = {"served_entities": [{"entity_name": "m", "entity_version": "2"}]}
    kept = keep_extensions(EndpointCoreConfig.model_validate(entities), current)  # what the SDK's update_config sends
    assert kept.monitoring is not None and kept.monitoring.enabled is False
    assert kept.served_entities[0].entity_version == "2"
    removed = keep_extensions(EndpointCoreConfig.model_validate({**entities, "monitoring": None}), current)
    assert removed.monitoring is None
    replaced = keep_extensions(EndpointCoreConfig.model_validate({**entities, "monitoring": {"min_rows": 5}}), current)
    assert replaced.monitoring.enabled is True and replaced.monitoring.min_rows == 5
