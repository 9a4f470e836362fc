"""The benchmark result files hold what the docs' generator needs, and every run renders onto a page.

docs/gen/benchmarks.py renders the tables of docs/benchmarks/ from benchmarks/results/*.json at build time; these
tests read the same files without a docs build.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_gen_benchmarks", ROOT / "docs" / "gen" / "benchmarks.py")
assert _spec and _spec.loader
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

DATA_FILES = sorted(gen.RESULTS.glob("*.json"))
PAGES = sorted(gen.PAGES.glob("*.md"))


@pytest.mark.parametrize("path", DATA_FILES, ids=lambda p: p.stem)
def test_each_data_file_has_the_required_keys_and_each_run_renders(path: Path) -> None:
    data = json.loads(path.read_text())
    gen.check(data, path.stem)  # raises, naming the key, on a missing one
    for run in data["runs"]:
        for key in gen.RUN_KEYS:
            assert run[key], f"{path.stem}/{run['id']}: {key} is empty (write 'not recorded')"
        text = gen.render(run)
        assert text.startswith(f"**{run['title']}**")
        assert gen._row(run["columns"]) in text
        for row in run["rows"]:
            assert gen._row(row) in text
        assert run["date"] in text and run["commit"] in text and run["machine_load"] in text
        assert all(verdict in text for verdict in run.get("verdicts", []))


def test_there_are_data_files_and_pages() -> None:
    assert len(DATA_FILES) >= 10 and len(PAGES) >= 10, (DATA_FILES, PAGES)


def test_every_page_marker_names_a_run_and_every_run_is_on_a_page() -> None:
    results = gen.load()
    shown = set()
    for page in PAGES:
        text = page.read_text()
        filled = gen.fill(text, results)  # raises, naming the file or run, on an unknown one
        assert not gen.markers(filled), f"{page.name}: a marker left unfilled"
        shown.update(gen.markers(text))
    every = {(name, run["id"]) for name, data in results.items() for run in data["runs"]}
    assert every - shown == set(), "runs no page shows"


def test_a_missing_key_and_an_unknown_run_are_named() -> None:
    run = {"id": "r", "title": "t", "command": "c", "date": "d", "commit": "x", "columns": ["a"], "rows": [["1"]]}
    with pytest.raises(ValueError, match="bench/r: missing machine_load"):
        gen.check({"benchmark": "bench", "title": "T", "runs": [run]}, "bench")
    with pytest.raises(ValueError, match="bench: missing runs"):
        gen.check({"benchmark": "bench", "title": "T"}, "bench")
    with pytest.raises(ValueError, match="a row of 2 cells under 1 columns"):
        gen.check(
            {"benchmark": "bench", "title": "T", "runs": [{**run, "machine_load": "m", "rows": [["1", "2"]]}]}, "bench"
        )
    with pytest.raises(ValueError, match="has no run 'nope'"):
        gen.fill("<!-- results: serving/nope -->\n", gen.load())


def test_a_command_not_recorded_is_not_shown_as_code() -> None:
    run = {
        "id": "r",
        "title": "t",
        "command": "not recorded",
        "date": "d",
        "commit": "not recorded",
        "machine_load": "m",
        "columns": ["a"],
        "rows": [["1"]],
    }
    assert "- Command: not recorded\n" in gen.render(run)
    assert "- Command: `python -m x`\n" in gen.render({**run, "command": "python -m x"})
    noted = gen.render({**run, "command": "python -m x", "command_note": "then with `--y`"})
    assert "- Command: `python -m x` (then with `--y`)\n" in noted
