"""infra/bootstrap.py: what ``make env`` keeps, rebuilds and refuses (the whole no-uv path runs in ``.ci/run``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra import bootstrap


@pytest.fixture()
def env() -> dict[str, str]:
    return bootstrap.clean_environ(dict(os.environ))


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


def test_the_build_ignores_what_would_redirect_it_or_write_into_the_venv_first():
    env = bootstrap.clean_environ(
        {
            "PYTHONPYCACHEPREFIX": "/x/.venv/pycache",
            "UV_PROJECT_ENVIRONMENT": "/elsewhere",
            "VIRTUAL_ENV": "/other",
            "PATH": "/bin",
        }
    )
    assert env == {"PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1"}


def test_a_venv_holding_only_bytecode_caches_is_removed(tmp_path, env):
    venv = tmp_path / ".venv"
    (venv / "pycache" / "uv").mkdir(parents=True)
    bootstrap.remove_unusable_venv(venv, env)
    assert not venv.exists()


def test_a_venv_without_its_bin_is_removed_and_a_working_one_kept(tmp_path, env):
    broken = _venv(tmp_path / "broken")
    for child in (broken / "bin").iterdir():
        child.unlink()
    (broken / "bin").rmdir()
    bootstrap.remove_unusable_venv(broken, env)
    assert not broken.exists()

    working = _venv(tmp_path / "working")
    bootstrap.remove_unusable_venv(working, env)
    assert (working / "bin" / "python").exists()


def test_a_venv_is_current_only_with_the_same_digest_and_a_python_that_starts(tmp_path, env):
    venv = _venv(tmp_path / ".venv")
    want = bootstrap.digest("0.0.1")
    assert not bootstrap.venv_is_current(venv, want, env)  # never synced
    (venv / ".synced").write_text(want + "\n")
    assert bootstrap.venv_is_current(venv, want, env)
    assert not bootstrap.venv_is_current(venv, bootstrap.digest("0.0.2"), env)  # another uv read the lock
    (venv / "bin" / "python").unlink()
    assert not bootstrap.venv_is_current(venv, want, env)


def test_a_failed_uv_install_says_so_and_leaves_nothing_half_installed(tmp_path, env):
    with pytest.raises(bootstrap.BootstrapError, match=r"could not install uv==0\.0\.0"):
        bootstrap.ensure_uv("/bin/false", "0.0.0", env, tools=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_python_of_another_version_is_refused_by_name(env):
    with pytest.raises(bootstrap.BootstrapError, match=r"needs Python 3\.11; '/bin/false' is not a working Python"):
        bootstrap.check_python("/bin/false", env)
