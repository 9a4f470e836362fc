"""make up REGIONS=N: each region's state folder, ports and environment, and the champions table of make status."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.regions import champions_table, layout, region_environ


def test_regions_get_their_own_folders_and_ports_and_the_primary_replicates_to_the_others():
    a, b, c = layout(Path("/s/regions"), 3)
    assert (a.name, a.home, b.home) == ("a", Path("/s/regions/a"), Path("/s/regions/b"))
    assert a.ports["TOLLFREE_GATEWAY_PORT"] == 8080 and b.ports["TOLLFREE_GATEWAY_PORT"] == 8180
    assert c.ports["TOLLFREE_MLFLOW_PORT"] == 5200 and b.ports["TOLLFREE_POSTGRES_PORT"] == 5533
    ports = [set(r.ports.values()) for r in (a, b, c)]
    assert not (ports[0] & ports[1] or ports[1] & ports[2] or ports[0] & ports[2])
    user = {"MLFLOW_TRACKING_URI": "sqlite:///x.db", "TOLLFREE_REPLICATE_TO": "http://elsewhere", "PATH": "/bin"}
    env_a, env_b = region_environ(a, [a, b, c], user), region_environ(b, [a, b, c], user)
    assert env_a["TOLLFREE_REPLICATE_TO"] == "http://127.0.0.1:5100,http://127.0.0.1:5200"
    assert "TOLLFREE_REPLICATE_TO" not in env_b and "MLFLOW_TRACKING_URI" not in env_b
    assert env_b["TOLLFREE_HOME"] == "/s/regions/b" and env_b["TOLLFREE_GATEWAY_PORT"] == "8180"
    assert env_a["TOLLFREE_ENDPOINTS_FILE"] == env_b["TOLLFREE_ENDPOINTS_FILE"] == "/s/regions/endpoints.yaml"
    with pytest.raises(ValueError, match="REGIONS must be 2 to 5"):
        layout(Path("/s"), 1)


def test_the_champions_table_flags_a_region_whose_champion_is_not_a_copy_of_the_primarys():
    lines = champions_table(
        {
            "a": {"fraud": ("4", "fraud/4@r1"), "churn": ("2", "churn/2@r9")},
            "b": {"fraud": ("1", "fraud/4@r1"), "churn": ("1", "churn/1@r8")},
        }
    )
    assert lines == [
        "  churn                a: v2  b: v1  DIFFERS",
        "  fraud                a: v4  b: v1  same version",
    ]
    assert champions_table({"a": {"fraud": ("4", "k")}, "b": {}}) == ["  fraud                a: v4  b: -  DIFFERS"]


def test_region_parity_refuses_a_folder_that_is_no_region_and_a_sample_below_one(tmp_path, capsys):
    from flows.region_parity import main

    assert main(["--other-home", str(tmp_path / "nowhere")]) == 1
    assert "is not a region's state folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()  # nothing created
    with pytest.raises(SystemExit):
        main(["--other-home", str(tmp_path), "--sample", "0"])
