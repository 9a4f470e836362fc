"""Endpoints files: what is refused (naming file, line and field) and what the apply flow would change."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.apply import config_body, create_body, plan
from flows.endpoint_file import EndpointFileError, parse_endpoints, read_endpoints
from serving.endpoints.spec import EndpointRecord
from serving.endpoints.validation import normalize_config
from serving.endpoints.views import endpoint_view

GOOD = """\
endpoints:
  - name: fraud
    config:
      served_entities:
        - entity_name: fraud
          entity_alias: champion
          min_replicas: 1
          max_replicas: 2
    ai_gateway:
      rate_limits: [{calls: 100, renewal_period: minute, key: endpoint}]
    tags: [{key: team, value: risk}]
  - name: fraud-pinned
    config:
      served_entities:
        - {entity_name: fraud, entity_version: "3"}
"""


def _resolve(versions: dict[tuple[str, str], str]):  # type: ignore[no-untyped-def]
    return lambda model, alias: versions[(model, alias)]


def _served(declared, version: str) -> dict:  # type: ignore[no-untyped-def]
    """The gateway's view of ``declared`` once created, its aliases at ``version``."""
    config = normalize_config(declared.request.config, declared.name)
    for entity in config.served_entities:
        entity.resolved_version = entity.resolved_version or version
    record = EndpointRecord(
        name=declared.name, id="x", creator="t", created_ms=1, updated_ms=1, config=config,
        ready="READY", config_update="NOT_UPDATING", tags=[{"key": "team", "value": "risk"}],
    )  # fmt: skip
    if declared.ai_gateway is not None:
        from serving.generative.ai_gateway import ai_gateway_view

        record.ai_gateway = ai_gateway_view(declared.ai_gateway)
    return endpoint_view(record)


def test_a_good_file_parses_into_checked_endpoints_with_their_lines() -> None:
    first, second = parse_endpoints(GOOD, "regions.yaml")
    assert (first.name, first.line, second.name, second.line) == ("fraud", 2, "fraud-pinned", 12)
    assert first.config.served_entities[0].name == "fraud-champion"
    assert first.ai_gateway is not None and first.ai_gateway.rate_limits
    assert second.config.served_entities[0].resolved_version == "3"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("min_replicas: 1", "min_replica: 1"), "f.yaml:7: endpoints[0].config.served_entities[0]"
         ".min_replica: "),
        (GOOD.replace("max_replicas: 2", "max_replicas: two"), "f.yaml:8: endpoints[0].config.served_entities[0]"
         ".max_replicas: "),
        (GOOD.replace("    tags:", "    tag:"), "f.yaml:11: endpoints[0].tag: unknown field"),
        (GOOD.replace("renewal_period: minute", "renewal_period: fortnight"), "f.yaml:10: endpoints[0].ai_gateway"),
        (GOOD.replace("name: fraud-pinned", "name: fraud"), "f.yaml:12: endpoints[1].name: endpoint fraud is declared"
         " twice"),
        (GOOD.replace("name: fraud-pinned", "name: 'bad name'"), "f.yaml:12: endpoints[1].name: endpoint name"),
        (GOOD.replace("  - name: fraud-pinned\n", "  - name: fraud-pinned\n    colour: red\n"), "f.yaml:13: "
         "endpoints[1].colour: unknown field"),
        ("endpoints: []\n", "f.yaml:1: endpoints: must be a list of one or more endpoints"),
        ("endpoints:\n  - name: a\n    config: [1\n", "f.yaml:4: not valid YAML"),
        ("endpoint:\n  - name: a\n", "f.yaml:1: endpoint: unknown field"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_naming_file_line_and_field(text: str, expected: str) -> None:
    with pytest.raises(EndpointFileError) as caught:
        parse_endpoints(text, "f.yaml")
    assert str(caught.value).startswith(expected), str(caught.value)


def test_a_normalisation_error_points_at_the_field_it_names() -> None:
    text = GOOD.replace("          max_replicas: 2\n", "          max_replicas: 2\n        - entity_name: fraud\n"
                        "          entity_alias: champion\n")  # fmt: skip
    with pytest.raises(EndpointFileError, match=r"^f.yaml:9: endpoints\[0\].config.served_entities\[1\]"):
        parse_endpoints(text, "f.yaml")


def test_an_endpoint_in_two_files_is_refused_and_a_missing_file_named(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(GOOD)
    (tmp_path / "b.yaml").write_text(GOOD)
    with pytest.raises(EndpointFileError, match=r"b.yaml:2: endpoint fraud is also declared in .*a.yaml"):
        read_endpoints([tmp_path / "a.yaml", tmp_path / "b.yaml"])
    with pytest.raises(EndpointFileError, match=r"nope.yaml: cannot be read"):
        read_endpoints([tmp_path / "nope.yaml"])


def test_what_the_gateway_serves_already_is_unchanged_and_a_moved_alias_is_an_update() -> None:
    fraud, pinned = parse_endpoints(GOOD)
    resolve = _resolve({("fraud", "champion"): "4"})
    assert plan(fraud, _served(fraud, "4"), resolve).action == "unchanged"
    assert plan(pinned, _served(pinned, "9"), resolve).action == "unchanged"
    moved = plan(fraud, _served(fraud, "3"), resolve)
    assert moved.action == "update" and "-  entity_version: '3'" in moved.config_diff.replace("  - ", "  ")
    assert "+  entity_version: '4'" in moved.config_diff.replace("  - ", "  ") and not moved.ai_gateway_diff


def test_a_changed_field_or_ai_gateway_is_an_update_and_a_missing_endpoint_a_create() -> None:
    fraud, _ = parse_endpoints(GOOD)
    resolve = _resolve({("fraud", "champion"): "4"})
    served = _served(fraud, "4")
    (bigger,) = parse_endpoints(GOOD.replace("max_replicas: 2", "max_replicas: 3").split("  - name: fraud-pinned")[0])
    change = plan(bigger, served, resolve)
    assert change.action == "update" and "+  max_replicas: 3" in change.config_diff and not change.ai_gateway_diff
    (slower,) = parse_endpoints(GOOD.replace("calls: 100", "calls: 50").split("  - name: fraud-pinned")[0])
    change = plan(slower, served, resolve)
    assert change.action == "update" and not change.config_diff and "calls: 50" in change.ai_gateway_diff
    assert plan(fraud, None, resolve).action == "create"
    untagged = parse_endpoints(GOOD.replace("    tags: [{key: team, value: risk}]\n", ""))[0]
    assert plan(untagged, served, resolve).notes


def test_bodies_send_what_the_file_sets_and_remove_extension_blocks_it_leaves_out() -> None:
    fraud, _ = parse_endpoints(GOOD)
    body = config_body(fraud)
    assert body["monitoring"] is None and body["stream_inputs"] is None and body["name"] == "fraud"
    assert body["served_entities"] == [
        {"entity_name": "fraud", "entity_alias": "champion", "min_replicas": 1, "max_replicas": 2}
    ]
    created = create_body(fraud)
    assert "ai_gateway" not in created and created["tags"] == [{"key": "team", "value": "risk"}]


def test_an_endpoint_whose_last_rollout_failed_is_sent_again():
    fraud, _ = parse_endpoints(GOOD)
    served = _served(fraud, "4")
    served["state"]["config_update"] = "UPDATE_FAILED"
    change = plan(fraud, served, _resolve({("fraud", "champion"): "4"}))
    assert change.action == "update" and change.config_diff and "failed" in change.notes[-1]


def test_the_example_file_make_up_regions_copies_is_valid():
    (fraud,) = read_endpoints([Path(__file__).resolve().parents[2] / "infra" / "endpoints.yaml"])
    assert fraud.name == "fraud" and fraud.config.served_entities[0].entity_alias == "champion"


def test_the_command_refuses_a_bad_file_before_it_starts_a_flow(tmp_path: Path, capsys: pytest.CaptureFixture):
    from flows.apply import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("max_replicas: 2", "max_replicas: plenty"))
    assert main(["-f", str(bad)]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"apply: {bad}:8: endpoints[0].config.served_entities[0].max_replicas: ") and "plenty" not in err
    )
    assert main(["-f", str(tmp_path / "none.yaml")]) == 2
    assert "none.yaml: cannot be read" in capsys.readouterr().err
