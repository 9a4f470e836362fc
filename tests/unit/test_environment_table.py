"""serving/settings.py's ``ENVIRONMENT`` table is the one list of tollfree's environment variables (the docs'
reference page is generated from it): every ``TOLLFREE_*`` name the code reads is in it, and every entry is read
somewhere. Documentation (``*.md``) counts as neither."""

from __future__ import annotations

import re

from serving.settings import ENVIRONMENT, PROJECT_DIR

FOLDERS = ("serving", "flows", "monitoring", "infra", "feature_repo")
NAME = re.compile(r"\bTOLLFREE_[A-Z0-9_]*[A-Z0-9]\b")
TABLE_MODULE = PROJECT_DIR / "serving" / "settings.py"


def names_in_code() -> dict[str, list[str]]:
    """Each TOLLFREE_* name in the folders' files (the table's own module aside), with the files it is in."""
    found: dict[str, list[str]] = {}
    for folder in FOLDERS:
        for path in sorted((PROJECT_DIR / folder).rglob("*")):
            if not path.is_file() or path.suffix in (".md", ".pyc") or path == TABLE_MODULE:
                continue
            for name in set(NAME.findall(path.read_text(errors="ignore"))):
                found.setdefault(name, []).append(str(path.relative_to(PROJECT_DIR)))
    return found


def test_every_variable_the_code_reads_is_in_the_table() -> None:
    table = {v.name for v in ENVIRONMENT}
    missing = {name: files for name, files in names_in_code().items() if name not in table}
    assert not missing, f"add these to ENVIRONMENT in serving/settings.py: {missing}"


def test_every_table_entry_is_read_somewhere() -> None:
    used = names_in_code()
    unused = sorted(v.name for v in ENVIRONMENT if v.name not in used)
    assert not unused, f"ENVIRONMENT lists variables nothing in {', '.join(FOLDERS)} reads: {unused}"


def test_each_entry_is_named_once_and_says_what_it_means() -> None:
    names = [v.name for v in ENVIRONMENT]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(v.default and v.meaning and v.area for v in ENVIRONMENT)
