"""The stack's Prometheus: its rules pass ``promtool`` and their own unit tests, and its configuration passes
``promtool check config`` (``tests/integration/test_infra.py`` checks the metric names the rules read)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from infra import prometheus
from infra.packages import ensure_promtool

PROJECT = Path(__file__).resolve().parents[2]
RULES_TEST = PROJECT / "infra" / "prometheus" / "rules_test.yml"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ensure_promtool(), *args], capture_output=True, text=True, timeout=120)


def test_the_rules_pass_promtool_and_their_unit_tests():
    checked = _promtool("check", "rules", str(prometheus.RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = _promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_the_stacks_configuration_passes_promtool(tmp_path):
    for name in ("admin", "replica"):
        (tmp_path / name).write_text("token\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus.config(tmp_path / "targets", tmp_path / "admin", tmp_path / "replica"))
    checked = _promtool("check", "config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    jobs = {job["job_name"]: job for job in yaml.safe_load(config.read_text())["scrape_configs"]}
    assert jobs["tollfree-gateway"]["file_sd_configs"][0]["files"] == [str(tmp_path / "targets" / "*.gateway.json")]
    assert jobs["tollfree-replica"]["authorization"]["credentials_file"] == str(tmp_path / "replica")
