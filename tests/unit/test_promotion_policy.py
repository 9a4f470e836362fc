from __future__ import annotations

from pathlib import Path

import pytest

from serving.registry.promotion_policy import PromotionPolicyError, load_policy, policy_for

SHIPPED = Path(__file__).resolve().parents[2] / "flows" / "promotion_policies"  # the promote flow's default folder

GOOD = """\
model: m
gates:
  quality:
    min:
      eval_pr_auc: 0.2
  latency:
    p50_ms: 10
    p99_ms: 50
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    return path


def test_the_shipped_fraud_policy_loads():
    policy = policy_for("fraud", SHIPPED)
    assert set(policy.gates) == {"quality", "latency", "fairness", "cost", "data", "compatibility"}
    assert policy.feature_service == "fraud_v1" and policy.bootstrap_champion


def test_a_good_policy_loads(tmp_path):
    policy = load_policy(write(tmp_path, GOOD))
    assert policy.gates["latency"] == {"p50_ms": 10, "p99_ms": 50}


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (GOOD.replace("  latency:", "  latancy:"), 6, "unknown gate 'latancy'"),
        (GOOD.replace("    p99_ms: 50\n", ""), 6, "missing its threshold 'p99_ms'"),
        (GOOD.replace("    p50_ms: 10", "    p50_ms: fast"), 7, "latency.p50_ms must be a number"),
        (GOOD.replace("    p50_ms: 10", "    p50_ms: 10\n    p95_ms: 20"), 8, "unknown setting 'p95_ms'"),
        ("model: m\nowner: x\ngates: {}\n", 2, "unknown key 'owner'"),
        (
            GOOD.replace("    p50_ms: 10", "    p50_ms: 10\n    probes: 0"),
            8,
            "latency.probes must be a whole number of at least 1",
        ),
        (GOOD.replace("    p50_ms: 10", "    p50_ms: 10\n    probes: 1.5"), 8, "latency.probes must be a whole number"),
    ],
)
def test_bad_policies_are_refused_naming_the_line(tmp_path, text, line, words):
    with pytest.raises(PromotionPolicyError) as err:
        load_policy(write(tmp_path, text))
    assert f"line {line}" in str(err.value) and words in str(err.value)


def test_missing_policy_and_wrong_model(tmp_path):
    with pytest.raises(PromotionPolicyError, match="no promotion policy"):
        policy_for("nobody", tmp_path)
    (tmp_path / "m2.yaml").write_text(GOOD)  # a file named for m2 that declares model m
    with pytest.raises(PromotionPolicyError, match="is for model 'm'"):
        policy_for("m2", tmp_path)
