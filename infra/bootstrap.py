"""Build or repair the project's environment (``.venv``) from the committed ``uv.lock``: what ``make env`` runs.

Needs only the Python that runs it (3.11, with pip): uv is installed at the pinned version into ``.tools/`` of the
checkout (never into that Python, never a uv found on the machine: the lock file is only as reproducible as the tool
that reads it), then ``uv sync --frozen`` builds ``.venv``. It runs before every ``make demo`` and ``make test``
and is quick when nothing changed: ``.venv/.synced`` holds a digest of ``pyproject.toml``, ``uv.lock`` and the uv
version, and the environment's Python must start.

A ``.venv`` that cannot be used is rebuilt, never left blocking: one whose Python is gone or does not start (a
removed ``bin/``, a Python uninstalled since), one holding only byte-code caches, one left by an interrupted sync.
A uv install interrupted half-way is discarded (it is installed into a temporary folder and moved in whole).

Standard library only: it runs before any dependency exists.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

UV_VERSION = "0.13.9"
ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = VENV / ".synced"
TOOLS = ROOT / ".tools"
PYTHON_VERSION = (3, 11)

# Variables that would send uv or pip elsewhere than this checkout's .venv, or write into it before it exists.
_CLEARED = (
    "UV_PROJECT_ENVIRONMENT",
    "VIRTUAL_ENV",
    "PYTHONPYCACHEPREFIX",
    "PIP_TARGET",
    "PIP_PREFIX",
    "PIP_USER",
    "UV_PYTHON",
    "UV_NO_SYNC",
    "UV_OFFLINE_ONLY",
)


class BootstrapError(RuntimeError):
    """The environment cannot be built; the message says why and what to do."""


def clean_environ(environ: dict[str, str]) -> dict[str, str]:
    """``environ`` without what would redirect the build, and with byte-code writing off for it."""
    env = {k: v for k, v in environ.items() if k not in _CLEARED}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def digest(uv_version: str, root: Path = ROOT) -> str:
    """What ``.venv`` was built from: the project's dependency files and the uv that read them."""
    h = hashlib.sha256(uv_version.encode())
    for name in ("pyproject.toml", "uv.lock"):
        h.update(b"\0" + name.encode() + b"\0" + (root / name).read_bytes())
    return h.hexdigest()


def python_runs(python: Path, env: dict[str, str]) -> bool:
    """Whether ``python`` exists and starts."""
    if not python.exists():
        return False
    try:
        done = subprocess.run([str(python), "-c", "import sys"], env=env, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def venv_is_current(venv: Path, want: str, env: dict[str, str]) -> bool:
    stamp = venv / ".synced"
    try:
        recorded = stamp.read_text().strip()
    except OSError:
        return False
    return recorded == want and python_runs(venv / "bin" / "python", env)


def check_python(python: str, env: dict[str, str]) -> None:
    try:
        done = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError as exc:
        raise BootstrapError(f"cannot run {python!r} ({exc}); set PYTHON=/path/to/python3.11") from exc
    found, wanted = done.stdout.strip(), ".".join(map(str, PYTHON_VERSION))
    if done.returncode != 0 or found != wanted:
        raise BootstrapError(
            f"tollfree needs Python {wanted}; {python!r} is "
            f"{found or 'not a working Python'}: run make with PYTHON=/path/to/python3.11"
        )


def ensure_uv(python: str, version: str, env: dict[str, str], tools: Path = TOOLS) -> Path:
    """The pinned uv binary, installed with ``python -m pip`` into ``tools`` if it is not there yet."""
    home = tools / f"uv-{version}"
    uv = home / "bin" / "uv"
    if uv.exists():
        return uv
    tools.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".uv-{version}-", dir=tools))
    try:
        print(
            f"installing uv {version} into {home.relative_to(ROOT) if home.is_relative_to(ROOT) else home}", flush=True
        )
        done = subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-warn-script-location",
                "--target",
                str(partial),
                f"uv=={version}",
            ],
            env=env,
        )
        if done.returncode != 0 or not (partial / "bin" / "uv").exists():
            raise BootstrapError(
                f"pip could not install uv=={version} with {python!r}: see pip's error above "
                "(the package index must be reachable, and that Python must have pip)"
            )
        shutil.rmtree(home, ignore_errors=True)
        partial.rename(home)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return uv


def remove_unusable_venv(venv: Path, env: dict[str, str]) -> None:
    """Remove ``venv`` if it exists but is no usable environment (uv refuses such a folder rather than fix it)."""
    if not venv.exists():
        return
    if (venv / "pyvenv.cfg").exists() and python_runs(venv / "bin" / "python", env):
        return
    print(f"{venv.name} is not a usable environment (no Python that starts): rebuilding it", flush=True)
    shutil.rmtree(venv)


def sync(uv: Path, python: str, env: dict[str, str], root: Path = ROOT) -> int:
    return subprocess.run([str(uv), "sync", "--frozen", "--python", python], cwd=root, env=env).returncode


def ensure_environment(python: str, uv_version: str = UV_VERSION, environ: dict[str, str] | None = None) -> bool:
    """Build ``.venv`` if it is missing, stale or broken; True if it had to be (re)built."""
    env = clean_environ(dict(os.environ if environ is None else environ))
    want = digest(uv_version)
    if venv_is_current(VENV, want, env):
        return False
    check_python(python, env)
    uv = ensure_uv(python, uv_version, env)
    remove_unusable_venv(VENV, env)
    STAMP.unlink(missing_ok=True)
    if sync(uv, python, env) != 0:
        # A folder left half-built by an interrupted sync, or an environment made by another Python: start afresh.
        print(f"uv sync failed on the existing {VENV.name}: removing it and building it again", flush=True)
        shutil.rmtree(VENV, ignore_errors=True)
        if sync(uv, python, env) != 0:
            raise BootstrapError("uv sync failed on a fresh .venv: see uv's error above")
    if not python_runs(VENV / "bin" / "python", env):
        raise BootstrapError("uv sync finished but .venv/bin/python does not start")
    tmp = STAMP.with_suffix(".tmp")
    tmp.write_text(want + "\n")
    tmp.replace(STAMP)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.bootstrap", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python", default=sys.executable, help="the Python 3.11 that builds .venv (default: the one running this)"
    )
    args = parser.parse_args(argv)
    try:
        ensure_environment(args.python)
    except BootstrapError as exc:
        print(f"make env: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
