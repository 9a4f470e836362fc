"""Every repository path the docs, comments and docstrings name exists, and no comment or docstring names a CI run
(``ci`` and two digits) or an issue number: a reader follows a path, and a run's or an issue's name says nothing
to a reader who was not there.

What counts as a path (:func:`paths_in`): a word with a ``/`` whose first part is one of the repository's top-level
folders (``serving/replicas/local.py``, ``infra/prefect``), which must exist from the root; and a word ending in
``.py``, ``.md``, ``.yaml`` or ``.yml`` (``replica_set.py``, ``promotion_policies/fraud.yaml``), which must exist
beside the file that names it, from the root, or as the tail of a repository path (a list of a folder's modules
names them by their own names), or be a docs page the docs' gen-files scripts write. URLs, absolute and home
paths, globs, placeholders (``*``, ``{}``, ``<>``) and a benchmark table's marker in a page are not paths of the
repository, nor is another project's path named with its project (``Ray's python/ray/serve/config.py``).
The CHANGELOG is history: not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_FOLDERS = ("serving", "simulator", "flows", "monitoring", "feature_repo", "infra", "benchmarks", "tests")
TOP_LEVEL = (*CODE_FOLDERS, "docs")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml")
WORD = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./-]*")
NOT_A_PATH = re.compile(r"[*{}<>$~]|://")
FOREIGN = re.compile(r"[’']s $")  # "Ray's python/ray/...": another project's path
SKIPPED = {".git", ".venv", "node_modules", "__pycache__", "site"}
HISTORY = re.compile(r"\bci\d{2}\b|\bissues? #?\d+\b", re.IGNORECASE)
MARKER = re.compile(r"<!-- results: [^>]*-->")  # a benchmark run's id, where docs/gen/benchmarks.py puts its table
GENERATED = re.compile(r'mkdocs_gen_files\.open\(f?"([^"{]+)"')  # pages the docs' gen-files scripts write


@cache
def generated(root: Path) -> frozenset[Path]:
    """The docs pages made at build time (``docs/gen/*.py``): they exist in the site, not in the repository."""
    scripts = (root / "docs" / "gen").glob("*.py")
    return frozenset((root / "docs" / name).resolve() for gen in scripts for name in GENERATED.findall(gen.read_text()))


def docs() -> list[Path]:
    named = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", ROOT / "infra" / "README.md"]
    return [p for p in named if p.exists()] + sorted((ROOT / "docs").rglob("*.md"))


def code() -> list[Path]:
    return sorted(p for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*.py"))


def prose(source: str) -> Iterator[tuple[int, str]]:
    """The comments and docstrings of a module, each with the line it starts on."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                yield first.lineno, first.value.value


def paths_in(text: str) -> Iterator[str]:
    """The words of ``text`` that name a repository path (see the module's docstring)."""
    for match in WORD.finditer(text):
        start = match.start()
        if start and text[start - 1] in "/~$:@":  # the tail of an absolute path, a URL or a variable
            continue
        word = match.group().split("::")[0].rstrip(".-/")
        if NOT_A_PATH.search(text[max(0, start - 3) : match.end() + 1]) or word.startswith("."):
            continue
        if FOREIGN.search(text[max(0, start - 3) : start]):
            continue
        first = word.split("/")[0]
        if ("/" in word and first in TOP_LEVEL) or word.endswith(FILE_SUFFIXES):
            yield word


@cache
def tails(root: Path) -> frozenset[str]:
    """Every tail of every repository path under ``root``: its last part, its last two parts, and so on."""
    out = set()
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if not SKIPPED & set(parts):
            out.update("/".join(parts[i:]) for i in range(len(parts)))
    return frozenset(out)


def dangling(text: str, folder: Path, root: Path = ROOT) -> list[str]:
    """The paths ``text`` names that do not exist (``folder``: the naming file's)."""
    out = []
    for path in paths_in(text):
        if (folder / path).exists() or (root / path).exists() or (folder / path).resolve() in generated(root):
            continue
        if path.split("/")[0] not in TOP_LEVEL and path in tails(root):
            continue
        out.append(path)
    return out


def test_every_path_named_in_the_docs_exists():
    found = []
    for doc in docs():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            found += [f"{doc.relative_to(ROOT)}:{number}: {p}" for p in dangling(MARKER.sub("", line), doc.parent)]
    assert not found, "paths named in the docs that do not exist:\n" + "\n".join(found)


def test_every_path_named_in_comments_and_docstrings_exists():
    found = []
    for module in code():
        for number, text in prose(module.read_text()):
            found += [f"{module.relative_to(ROOT)}:{number}: {p}" for p in dangling(text, module.parent)]
    assert not found, "paths named in comments or docstrings that do not exist:\n" + "\n".join(found)


def test_no_comment_or_docstring_names_a_ci_run_or_an_issue():
    found = []
    for module in code():
        for number, text in prose(module.read_text()):
            found += [f"{module.relative_to(ROOT)}:{number}: {m.group()}" for m in HISTORY.finditer(text)]
    assert not found, "CI run names or issue numbers in comments or docstrings:\n" + "\n".join(found)


def test_the_checks_find_a_planted_dangling_path_and_history(tmp_path: Path):
    (tmp_path / "serving" / "replicas").mkdir(parents=True)
    (tmp_path / "serving" / "replicas" / "replica_set.py").write_text("")
    text = (
        "see serving/replicas/replica_set.py, replica_set.py beside it, replicas/replica_set.py and serving/replicas; "
        "not serving/dispatcher.py, replica/replica_set.py nor STACK_NOTES.md (found in ci66, see issue 20); "
        "never https://example.com/serving/x.py, /usr/lib/serving/y.py, ~/serving/z.py, serving/*.py, <model>.yaml "
        "nor Ray's python/ray/serve/config.py"
    )
    assert dangling(text, tmp_path / "flows", root=tmp_path) == [
        "serving/dispatcher.py",
        "replica/replica_set.py",
        "STACK_NOTES.md",
    ]
    assert [m.group() for m in HISTORY.finditer(text)] == ["ci66", "issue 20"]
    source = '"""Module: see serving/gone.py."""\n\n\ndef f():\n    """Nothing."""\n    return 1  # ci70: gone\n'
    assert sorted(prose(source)) == [(1, "Module: see serving/gone.py."), (5, "Nothing."), (6, "# ci70: gone")]
