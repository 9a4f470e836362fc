"""Generates reference/flows.md: each Prefect flow's name, parameters and docstring, read from the ``@flow``
functions of flows/*.py with ``ast`` (the page needs neither Prefect nor the flows' imports; run by
mkdocs-gen-files)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import mkdocs_gen_files

FLOWS = Path(__file__).resolve().parents[2] / "flows"


def flow_name(decorator: ast.expr) -> str | None:
    """The flow's name if ``decorator`` is ``@flow`` or ``@flow(name=...)``, else None."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call is not None else decorator
    if not (isinstance(target, ast.Name) and target.id == "flow"):
        return None
    for keyword in call.keywords if call is not None else ():
        if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
            return str(keyword.value.value)
    return ""


def parameters(fn: ast.FunctionDef) -> list[tuple[str, str, str]]:
    args = fn.args.posonlyargs + fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    pairs = list(zip(args, defaults, strict=True)) + list(zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True))
    return [
        (
            a.arg,
            ast.unparse(a.annotation) if a.annotation is not None else "-",
            "required" if d is None else f"`{ast.unparse(d)}`",
        )
        for a, d in pairs
    ]


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def section(module: str, fn: ast.FunctionDef, name: str) -> list[str]:
    doc = inspect.cleandoc(ast.get_docstring(fn) or "")
    lines = [f"## `{name or fn.name}`", "", f"`flows/{module}.py`, function `{fn.name}`.", ""]
    if doc:
        lines += [doc, ""]
    params = parameters(fn)
    if params:
        lines += ["| parameter | type | default |", "| --- | --- | --- |"]
        lines += [f"| `{p}` | {cell(t)} | {cell(d)} |" for p, t, d in params]  # no code span: it would show the escape
    else:
        lines.append("No parameters.")
    return [*lines, ""]


def page() -> str:
    lines = [
        "# Flows",
        "",
        "Every Prefect flow, its parameters from its signature, generated from the `@flow` functions of",
        "`flows/*.py`. The scheduled deployments that run them are in `flows/deployments.py`",
        "([Deployments](../how-to/monitoring.md#scheduled-deployments)).",
        "",
    ]
    for path in sorted(FLOWS.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                for decorator in node.decorator_list:
                    name = flow_name(decorator)
                    if name is not None:
                        lines += section(path.stem, node, name)
    return "\n".join(lines)


with mkdocs_gen_files.open("reference/flows.md", "w") as out:
    out.write(page())
