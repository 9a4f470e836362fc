"""serving/'s folders import one way only: down the layers written in docs/concepts/architecture.md.

Every module under serving/ is parsed (``ast``: imports inside functions and ``TYPE_CHECKING`` blocks
count too) and each import of another part of serving becomes an edge between two parts: a folder
(``gateway``, ``replicas``, ...) or a module at serving/'s root (``settings``, ``__main__``, ...).
An edge the table below does not allow fails the test naming the module, the line and the import.
Nothing in serving/ imports ``flows``, ``monitoring`` or Prefect: the flows call serving, not the reverse.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SERVING = Path(__file__).resolve().parents[2] / "serving"
LAYERS_PAGE = SERVING.parent / "docs" / "concepts" / "architecture.md"

# Top to bottom; each part may import only parts below it, and only those it lists. The layers table of
# docs/concepts/architecture.md says the same.
LAYERS: dict[str, frozenset[str]] = {
    "__main__": frozenset(
        {"gateway", "edge", "endpoints", "replicas", "inference_log", "state", "settings"}
    ),  # python -m serving
    "mlflow_plugin": frozenset({"discovery"}),  # a client of the gateway's API
    "gateway": frozenset(
        {
            "console",
            "edge",
            "endpoints",
            "streams",
            "generative",
            "replicas",
            "traffic",
            "autoscaler",
            "protocol",
            "inference_log",
            "registry",
            "state",
            "discovery",
            "heap",
            "settings",
        }
    ),
    "console": frozenset({"endpoints", "replicas", "registry", "autoscaler", "protocol"}),  # the browser console
    "edge": frozenset({"protocol", "inference_log", "state"}),  # edge bundles, devices and rollouts
    "endpoints": frozenset(
        {"streams", "generative", "replicas", "traffic", "autoscaler", "protocol", "registry", "state"}
    ),
    "streams": frozenset({"traffic", "protocol", "inference_log"}),  # Redis Streams front doors
    "replicas": frozenset({"traffic", "autoscaler", "protocol", "state", "settings"}),  # with the replica table
    "replica_server": frozenset(
        {"features", "generative", "traffic", "protocol", "heap", "settings"}
    ),  # its own process
    "features": frozenset({"protocol"}),
    "generative": frozenset({"protocol"}),  # chat requests, AI gateway
    "traffic": frozenset({"protocol"}),
    "batch": frozenset({"registry"}),
    "registry": frozenset({"settings"}),  # the model's lifecycle
    "autoscaler": frozenset(),
    "protocol": frozenset(),
    "inference_log": frozenset(),
    "state": frozenset({"settings"}),  # the shared state store
    "discovery": frozenset({"settings"}),  # where a gateway listens
    "heap": frozenset(),  # the collector kept off the request path
    "settings": frozenset(),
}
ORDER = list(LAYERS)


@dataclass(frozen=True)
class Edge:
    path: Path
    line: int
    source: str  # the importing part
    target: str  # the imported part
    imported: str  # the module imported, dotted

    def __str__(self) -> str:
        return f"serving/{self.path.relative_to(SERVING)}:{self.line} imports {self.imported}"


def part_of(module: str) -> str | None:
    """The part of serving a dotted module belongs to (None outside serving, or serving itself)."""
    parts = module.split(".")
    if parts[0] != "serving" or len(parts) < 2:
        return None
    return parts[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SERVING.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted module) for every import in the module; ``from X import y`` counts as X.y when y
    is a module of package X (``from serving import settings``), else as X."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            folder = SERVING.parent.joinpath(*target.split("."))
            for alias in node.names:
                submodule = (folder / f"{alias.name}.py").exists() or (folder / alias.name).is_dir()
                out.append((node.lineno, f"{target}.{alias.name}" if submodule else target))
    return out


def serving_imports() -> Iterator[tuple[Path, str, int, str]]:
    """(file, its module, line, dotted module imported) for every import in serving/."""
    for path in sorted(SERVING.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, imported in imported_modules(tree, module, path.name == "__init__.py"):
            yield path, module, line, imported


def serving_edges() -> list[Edge]:
    edges = []
    for path, module, line, imported in serving_imports():
        source, target = part_of(module) or "__init__", part_of(imported)
        if target is not None and target != source:
            edges.append(Edge(path, line, source, target, imported))
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_layer_table_only_points_down() -> None:
    for part, allowed in LAYERS.items():
        above = {other for other in allowed if ORDER.index(other) <= ORDER.index(part)}
        assert not above, f"{part} is allowed to import {sorted(above)}, which are not below it"


def test_every_part_of_serving_is_in_the_table() -> None:
    parts = {
        p.stem if p.is_file() else p.name
        for p in SERVING.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name != "__init__.py")
    }
    assert parts == set(LAYERS), (
        f"add {sorted(parts - set(LAYERS))} to LAYERS (and to docs/concepts/architecture.md's layers)"
    )


def test_the_docs_state_the_same_layers() -> None:
    rows = {}
    for line in LAYERS_PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].rstrip("`").endswith(("/", ".py")):
            name = cells[0].strip("`").removesuffix("/").removesuffix(".py")
            if name in LAYERS:
                rows[name] = frozenset(c.strip(" `") for c in cells[2].split(",")) - {"-"}
    assert list(rows) == ORDER, f"{LAYERS_PAGE.name}'s layers table lists the parts in this order: " + ", ".join(ORDER)
    assert rows == LAYERS, {k: sorted(v) for k, v in LAYERS.items() if rows.get(k) != v}


def test_no_import_runs_up_a_layer() -> None:
    edges = serving_edges()
    assert edges, "no import between parts of serving found: is the parser looking at the right folder?"
    bad = []
    for edge in edges:
        if edge.target not in LAYERS.get(edge.source, frozenset()):
            where = "above" if ORDER.index(edge.target) < ORDER.index(edge.source) else "beside"
            bad.append(
                f"{edge}: {edge.source} may import only {sorted(LAYERS[edge.source])}; {edge.target} is {where} it"
            )
    assert not bad, "imports against the layers (docs/concepts/architecture.md):\n" + "\n".join(bad)


def test_serving_imports_neither_the_flows_nor_monitoring_nor_prefect() -> None:
    """The flows call serving/ and monitoring/, never the other way round; serving/registry, the model's
    lifecycle the flows drive, runs without Prefect."""
    bad = [
        f"serving/{path.relative_to(SERVING)}:{line} imports {imported}"
        for path, _, line, imported in serving_imports()
        if imported.split(".")[0] in ("flows", "monitoring", "prefect")
    ]
    assert not bad, "serving/ must not import flows/, monitoring/ or Prefect:\n" + "\n".join(bad)


def test_no_cycle_between_folders() -> None:
    edges = serving_edges()
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    assert find_cycle({"a": {"b"}, "b": {"a"}}), "the cycle finder finds a planted cycle"
    cycle = find_cycle(graph)
    hops = [
        next(str(e) for e in edges if (e.source, e.target) == (a, b)) for a, b in zip(cycle or [], (cycle or [])[1:])
    ]
    assert not cycle, f"cycle {' -> '.join(cycle or [])}:\n" + "\n".join(hops)


def test_the_cycle_check_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}}) is None


def test_relative_imports_resolve_to_their_part() -> None:
    tree = ast.parse(
        "from ..traffic import dispatcher\nfrom . import client\nfrom serving import settings\n"
        "from .local import Launcher\n"
    )
    found = imported_modules(tree, "serving.replicas.local_backend", is_package=False)
    assert [m for _, m in found] == [
        "serving.traffic.dispatcher",
        "serving.replicas.client",
        "serving.settings",
        "serving.replicas.local",
    ]


def test_the_gateway_process_loads_neither_feast_nor_the_replica_runtime() -> None:
    code = (
        "import sys; import serving.gateway.app, serving.__main__; "
        "print(sorted({m.split('.')[0] if not m.startswith('serving') else m for m in sys.modules "
        "if m.split('.')[0] in ('feast', 'sklearn') "
        "or m.split('.')[:2] in (['serving', 'replica_server'], ['serving', 'features'])}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=SERVING.parent, check=True
    ).stdout.strip()
    assert out == "[]", f"importing the gateway loaded {out}"
