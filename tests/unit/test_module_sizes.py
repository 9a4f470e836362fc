"""Sizes: no module over 400 lines and no function over 80 lines, outside the simulator's baselines.

A module's lines are its newlines; a function's, from its ``def`` to its last line (``ast``), nested ones
counted on their own too. simulator/baselines.py holds the other systems' policies, each
written as its documentation states it: its functions are exempt, not the module's length.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("serving", "simulator", "flows", "feature_repo", "monitoring", "infra", "benchmarks")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
FUNCTIONS_EXEMPT = {"simulator/baselines.py"}


def modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """One line per limit the module at ``path`` breaks, naming it relative to ``root``."""
    text = path.read_text()
    name = path.relative_to(root).as_posix()
    found = []
    lines = text.count("\n")
    if lines > MAX_MODULE_LINES:
        found.append(f"{name}: {lines} lines (at most {MAX_MODULE_LINES})")
    if name not in FUNCTIONS_EXEMPT:
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    return found


def test_no_module_or_function_is_over_its_size() -> None:
    found = modules()
    assert len(found) > 50, f"only {len(found)} modules found: is the walk looking at the right folders?"
    over = [line for path in found for line in oversized(path)]
    assert not over, "over the size limits:\n" + "\n".join(over)


def test_the_check_names_an_oversized_module_and_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    planted = tmp_path / "benchmarks" / "big.py"
    planted.parent.mkdir()
    planted.write_text("def long():\n" + body + "\n" + "\n" * MAX_MODULE_LINES)
    assert oversized(planted, tmp_path) == [
        f"benchmarks/big.py: {MAX_FUNCTION_LINES + 1 + MAX_MODULE_LINES} lines (at most {MAX_MODULE_LINES})",
        f"benchmarks/big.py:1 long: {MAX_FUNCTION_LINES + 1} lines (at most {MAX_FUNCTION_LINES})",
    ]
    exempt = tmp_path / "simulator" / "baselines.py"
    exempt.parent.mkdir(parents=True)
    exempt.write_text("def long():\n" + body + "\n")
    assert oversized(exempt, tmp_path) == []
