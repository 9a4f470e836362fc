"""The documentation site builds, strictly, and README.md stays a landing page.

``mkdocs build --strict`` runs the docs' generator scripts (docs/gen/: the reference pages come from the code)
and fails on a broken link, a missing anchor or a nav entry without its page."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from serving.autoscaler.config import FIELD_DOCS, ScalingConfig

PROJECT_DIR = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=PROJECT_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    for page in ("reference/environment", "reference/autoscaling", "reference/http-api", "reference/flows"):
        assert (tmp_path / "site" / page / "index.html").is_file(), f"the generated page {page} is missing"


def test_the_readme_is_a_landing_page() -> None:
    lines = (PROJECT_DIR / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; the rest belongs in docs/"


def test_every_autoscaling_field_is_documented() -> None:
    names = {f.name for f in fields(ScalingConfig)}
    assert set(FIELD_DOCS) == names, {"undocumented": names - set(FIELD_DOCS), "unknown": set(FIELD_DOCS) - names}
    assert all(text.strip() for text in FIELD_DOCS.values())
