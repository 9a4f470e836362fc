"""The benchmark pages' result tables, rendered at build time from benchmarks/results/*.json (mkdocs-gen-files).

A page under docs/benchmarks/ names a run of a data file on a line of its own, ``<!-- results: peers/run-d -->``;
the build replaces that line with the run's table, its command, date, commit and machine load, and its verdicts.
So the figures live in one place, the data files, and a page cannot show a figure the data does not hold. The
plots in benchmarks/plots/ are copied into the site beside the pages, as benchmarks/plots/<name>.png.

Each data file holds ``benchmark``, ``title`` and ``runs``; each run ``id``, ``title``, ``command``, ``date``,
``commit``, ``machine_load``, ``columns`` and ``rows`` (cells as strings, as the run reported them), and
optionally ``command_note`` (how the command varied, in prose), ``duration``, ``environment`` and ``verdicts``.
What a run did not record says "not recorded".
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
PLOTS = ROOT / "benchmarks" / "plots"
PAGES = ROOT / "docs" / "benchmarks"
FILE_KEYS = ("benchmark", "title", "runs")
RUN_KEYS = ("id", "title", "command", "date", "commit", "machine_load", "columns", "rows")
NOT_RECORDED = "not recorded"
MARKER = re.compile(r"^<!-- results: (?P<name>[\w-]+)/(?P<run>[\w-]+) -->$", re.MULTILINE)


def check(data: dict, name: str) -> None:
    """Raise ValueError naming the first key a data file or one of its runs lacks, or a row of the wrong width."""
    missing = [key for key in FILE_KEYS if key not in data]
    if missing:
        raise ValueError(f"{name}: missing {', '.join(missing)}")
    if data["benchmark"] != name:
        raise ValueError(f"{name}: 'benchmark' is {data['benchmark']!r}, not the file's name")
    if not data["runs"]:
        raise ValueError(f"{name}: no runs")
    for run in data["runs"]:
        where = f"{name}/{run.get('id', '?')}"
        missing = [key for key in RUN_KEYS if key not in run]
        if missing:
            raise ValueError(f"{where}: missing {', '.join(missing)}")
        if not run["rows"]:
            raise ValueError(f"{where}: no rows")
        for row in run["rows"]:
            if len(row) != len(run["columns"]):
                raise ValueError(f"{where}: a row of {len(row)} cells under {len(run['columns'])} columns: {row}")


def load(folder: Path = RESULTS) -> dict[str, dict]:
    """Every data file of ``folder`` by its name (the file's stem), each checked."""
    results = {}
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        check(data, path.stem)
        results[path.stem] = data
    return results


def find_run(results: dict[str, dict], name: str, run_id: str) -> dict:
    if name not in results:
        raise ValueError(f"no data file benchmarks/results/{name}.json")
    for run in results[name]["runs"]:
        if run["id"] == run_id:
            return run
    raise ValueError(f"benchmarks/results/{name}.json has no run {run_id!r}")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _command(command: str) -> str:
    return command if command.startswith(NOT_RECORDED) else f"`{command}`"


def render(run: dict) -> str:
    """One run as markdown: its title, its table, then how it was run and what it concluded."""
    lines = [f"**{run['title']}**", "", _row(run["columns"]), _row(["---"] * len(run["columns"]))]
    lines += [_row(row) for row in run["rows"]]
    command = _command(run["command"])
    if run.get("command_note"):
        command += f" ({run['command_note']})"
    lines += ["", f"- Command: {command}", f"- Date: {run['date']}; commit: {run['commit']}"]
    lines.append(f"- Machine load: {run['machine_load']}")
    if run.get("duration"):
        lines.append(f"- Duration: {run['duration']}")
    if run.get("environment"):
        lines.append(f"- Environment: {run['environment']}")
    if run.get("verdicts"):
        lines += ["", "Verdicts:", ""] + [f"- {verdict}" for verdict in run["verdicts"]]
    return "\n".join(lines) + "\n"


def fill(page: str, results: dict[str, dict]) -> str:
    """``page`` with each results marker replaced by its run, rendered."""
    return MARKER.sub(lambda m: render(find_run(results, m["name"], m["run"])), page)


def markers(page: str) -> list[tuple[str, str]]:
    """The (data file, run) pairs a page shows."""
    return [(m["name"], m["run"]) for m in MARKER.finditer(page)]


def generate() -> None:
    """Write the filled pages and the plots into the site being built."""
    import mkdocs_gen_files

    results = load()
    for page in sorted(PAGES.glob("*.md")):
        name = f"benchmarks/{page.name}"
        with mkdocs_gen_files.open(name, "w") as out:
            out.write(fill(page.read_text(), results))
        mkdocs_gen_files.set_edit_path(name, page.relative_to(ROOT / "docs").as_posix())
    for plot in sorted(PLOTS.glob("*.png")):
        with mkdocs_gen_files.open(f"benchmarks/plots/{plot.name}", "wb") as out:
            out.write(plot.read_bytes())


# mkdocs-gen-files runs this file with runpy.run_path, whose module name is "<run_path>"; imported, it only defines.
if __name__ == "<run_path>":
    generate()
