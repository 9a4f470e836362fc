"""Programs from Debian's packages the stack and the tests run: found on this machine, or installed.

Nothing is installed by hand: a missing program is installed with ``apt-get`` when we are root (CI, a fresh
machine, a container); otherwise the error names the command to run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path


class PackageMissing(RuntimeError):
    pass


def ensure_binary(binary: str, package: str) -> str:
    """Path of ``binary``, installing Debian's ``package`` if it is missing and we may (root)."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() != 0:
        raise PackageMissing(f"{binary} is not installed and installing it needs root: apt-get install {package}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", package],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
    )
    found = shutil.which(binary)
    if not found:
        raise PackageMissing(f"apt-get installed {package} but {binary} is not on PATH")
    return found


def ensure_postgres() -> Path:
    """The folder of PostgreSQL's server programs (``initdb``, ``postgres``), installing Debian's package if missing."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
    if not found:
        ensure_binary("pg_ctlcluster", "postgresql")
        found = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
        if not found:
            raise PackageMissing("apt-get installed postgresql but no /usr/lib/postgresql/*/bin/postgres exists")
    return found[-1].parent


def ensure_haproxy() -> str:
    return ensure_binary("haproxy", "haproxy")


def ensure_prometheus() -> str:
    return ensure_binary("prometheus", "prometheus")


def ensure_promtool() -> str:
    """Prometheus's rule and configuration checker (Debian ships it in the ``prometheus`` package)."""
    return ensure_binary("promtool", "prometheus")


def ensure_chromium() -> tuple[str, str]:
    """Chromium and the chromedriver of the same release (Debian's ``chromium`` and ``chromium-driver``): what the
    console's browser test drives."""
    return ensure_binary("chromium", "chromium"), ensure_binary("chromedriver", "chromium-driver")
