"""One virtualenv per peer server of the serving benchmark (benchmarks/peers.py), kept out of the project's
uv.lock and .venv: each is made once under ~/.cache/tollfree-bench/venvs/ with uv and reused.

Every env pins the scikit-learn, joblib, pandas and numpy of the running interpreter's environment, so the
model that the benchmark pickles with joblib loads (and predicts) the same everywhere. The pins below were
resolved and run on Python 3.11 (uv 0.13): MLServer 1.7.1 needs uvloop 0.21 (it crashes at start with 0.23),
and its own fastapi pin (<0.116) keeps starlette 0.46 in that env.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

_SHARED = [f"{name}=={importlib.metadata.version(name)}" for name in ("scikit-learn", "joblib", "pandas", "numpy")]

PEERS: dict[str, list[str]] = {
    "mlserver": ["mlserver==1.7.1", "mlserver-sklearn==1.7.1", "uvloop==0.21.0", *_SHARED],
    "bentoml": ["bentoml==1.4.40", *_SHARED],
    "rayserve": ["ray[serve]==2.60.0", *_SHARED],
    "kserve": ["kserve==0.21.0", *_SHARED],
    "uvicorn": ["uvicorn[standard]==0.55.0", *_SHARED],
}

# the packages whose versions the benchmark's table shows, per env
KEY_PACKAGES: dict[str, list[str]] = {
    "mlserver": ["mlserver", "mlserver-sklearn", "uvicorn", "uvloop", "fastapi"],
    "bentoml": ["bentoml", "uvicorn", "starlette"],
    "rayserve": ["ray", "uvicorn", "fastapi"],
    "kserve": ["kserve", "uvicorn", "uvloop", "fastapi"],
    "uvicorn": ["uvicorn", "uvloop", "httptools"],
}
for _keys in KEY_PACKAGES.values():
    _keys += ["scikit-learn", "pandas", "numpy"]

VENVS_ROOT = Path.home() / ".cache" / "tollfree-bench" / "venvs"
_MARKER = ".tollfree-complete"


def venv_dir(name: str) -> Path:
    pins = sorted(PEERS[name])
    digest = hashlib.sha256("\n".join([*pins, platform.python_version()]).encode()).hexdigest()
    return VENVS_ROOT / f"{name}-{digest[:8]}"


def _uv() -> list[str]:
    """uv as a module of this interpreter, else the project's pinned uv (``make env`` installs it into .tools/),
    else the base interpreter's uv, else the uv on PATH."""
    from infra.bootstrap import TOOLS, UV_VERSION

    if importlib.util.find_spec("uv") is not None:
        return [sys.executable, "-m", "uv"]
    pinned = TOOLS / f"uv-{UV_VERSION}" / "bin" / "uv"
    base = Path(sys.base_prefix) / "bin" / "uv"
    found = str(pinned) if pinned.exists() else str(base) if base.exists() else shutil.which("uv")
    if found is None:
        raise RuntimeError("uv not found: neither `python -m uv` nor `uv` on PATH (pip install uv)")
    return [found]


def _run(name: str, cmd: list[str]) -> None:
    print(f"[peer_envs] {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"peer env {name!r}: {cmd[len(_uv())]} failed (exit {done.returncode}):\n{tail}")


def ensure_venv(name: str) -> Path:
    """The python of the peer's venv; made (uv venv + uv pip install of the pins) on the first call only."""
    if name not in PEERS:
        raise KeyError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
    root = venv_dir(name)
    python = root / "bin" / "python"
    if (root / _MARKER).exists():
        return python
    VENVS_ROOT.mkdir(parents=True, exist_ok=True)
    with open(VENVS_ROOT / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two benchmark processes making the same env: the second waits
        if (root / _MARKER).exists():
            return python
        print(f"[peer_envs] {name}: creating {root}", file=sys.stderr, flush=True)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(root)  # a half-made env from an interrupted run
        uv = _uv()
        _run(name, [*uv, "venv", "--quiet", "--python", sys.executable, str(root)])
        _run(name, [*uv, "pip", "install", "--python", str(python), *PEERS[name]])
        (root / _MARKER).write_text(json.dumps({"pins": PEERS[name]}) + "\n")
        print(f"[peer_envs] {name}: ready", file=sys.stderr, flush=True)
    return python


def versions(name: str) -> dict[str, str]:
    """Installed versions of the peer's key packages, read by the venv's own python."""
    code = "import importlib.metadata as m, json, sys\nprint(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    done = subprocess.run(
        [str(ensure_venv(name)), "-c", code, *KEY_PACKAGES[name]], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"peer env {name!r}: reading versions failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)
