"""The edge runtime beside `mlflow models serve` on the same model: single-row latency, memory, bytes shipped.

    python -m benchmarks.edge [--seconds 10] [--models demo,light] [--json]

Models (each fitted once, registered in a throwaway MLflow registry, bundled by ``serving.edge.bundling``):

  demo   the demo's fraud model, trained by the project's own flows on its synthetic world (GBDT 100 trees, depth 3)
  light  the peers benchmark's light GBDT (100 trees, depth 3, 20 float columns)

Servers, one at a time, on 127.0.0.1 and the same 2 cores as wrk:

  edge    ``tollfree-edge --bundle B`` from a virtualenv holding only the runtime's package (``pip install edge/``)
  mlflow  ``mlflow models serve -w 1 --env-manager local`` from a virtualenv holding only the model's requirements
          (its ``requirements.txt``: mlflow and scikit-learn, as an image ``mlflow models build-docker`` makes holds)

Both answer the MLflow scoring protocol with the class probabilities; each must answer the estimator's in-process
probabilities for a sample row (within 1e-4) before it is timed. Load: wrk, one connection, one thread, the same
one-row ``dataframe_split`` body, 2 s warm-up then ``--seconds`` timed. Memory: the process tree's PSS and RSS from
/proc (``smaps_rollup``) after the timed run. Bytes: the bundle file, the model's MLflow folder, and each
virtualenv (a lower bound of a container image: no operating system layer is counted).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import Provenance, build_fraud_world, log
from benchmarks.peer_envs import VENVS_ROOT, _uv
from benchmarks.serving_load import WARMUP_S, tree_cpu, wrk
from benchmarks.serving_servers import Server, start_session, throwaway_home

EDGE_SOURCE = Path(__file__).resolve().parent.parent / "edge"
TOKEN = "bench-edge-token"


def _source_digest(folder: Path) -> str:
    """The edge package's source, so a changed runtime gets a virtualenv of its own."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return h.hexdigest()


def _venv(name: str, requirements: list[str], salt: str = "") -> Path:
    """A virtualenv with only ``requirements`` (made once under the benchmarks' cache, keyed by them and ``salt``)."""
    digest = hashlib.sha256("\n".join([*sorted(requirements), salt]).encode()).hexdigest()[:8]
    root = VENVS_ROOT / f"{name}-{digest}"
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        root.parent.mkdir(parents=True, exist_ok=True)
        for cmd in (
            [*_uv(), "venv", "--quiet", "--python", str(Path(os.sys.executable)), str(root)],
            [*_uv(), "pip", "install", "--quiet", "--python", str(root / "bin" / "python"), *requirements],
        ):
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        (root / ".complete").write_text("\n".join(requirements))
    return root


def _bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _memory(root: int) -> dict[str, float]:
    """The process tree's proportional and resident set sizes, MiB."""
    pss = rss = 0
    for pid in tree_cpu(root):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
    return {"pss_mib": round(pss / 1024, 1), "rss_mib": round(rss / 1024, 1), "processes": len(tree_cpu(root))}


def _models(home: Path, wanted: list[str]) -> dict[str, dict[str, Any]]:
    """Per model: its registry name and version, held-out rows, input columns and the estimator."""
    import mlflow
    import pandas as pd
    from mlflow import MlflowClient

    from benchmarks import peers_models

    out: dict[str, dict[str, Any]] = {}
    client = MlflowClient()
    if "demo" in wanted:
        build_fraud_world(home)
        version = client.get_model_version_by_alias("fraud", "champion")
        held = pd.read_parquet(client.download_artifacts(version.run_id, "evaluation/eval.parquet", str(home)))
        out["demo"] = {"name": "fraud", "version": str(version.version), "held_out": held}
    if "light" in wanted:
        estimator, frame, _ = peers_models.fit("light", np.random.default_rng(peers_models.SEED))
        experiment = mlflow.create_experiment("bench-edge", artifact_location=(home / "artifacts").resolve().as_uri())
        with mlflow.start_run(experiment_id=experiment):
            info = mlflow.sklearn.log_model(
                estimator, name="model", input_example=frame.head(3), registered_model_name="edge-light",
                pyfunc_predict_fn="predict_proba", serialization_format="cloudpickle",
                pip_requirements=peers_models.pip_requirements(),
            )  # fmt: skip
        out["light"] = {"name": "edge-light", "version": str(info.registered_model_version), "held_out": frame}
    for model in out.values():
        uri = f"models:/{model['name']}/{model['version']}"
        model["uri"] = uri
        model["inputs"] = mlflow.models.get_model_info(uri).signature.inputs.input_names()
        model["estimator"] = mlflow.sklearn.load_model(uri)
        model["folder"] = Path(
            mlflow.artifacts.download_artifacts(uri, dst_path=str(home / "downloaded" / model["name"]))
        )
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from serving.edge import bundling
    from serving.replicas.local import free_port

    provenance = Provenance("benchmarks.edge", args.argv)
    home = throwaway_home("tollfree-bench-edge-")
    try:
        models = _models(home, args.models)
        key = Ed25519PrivateKey.generate()
        (home / "public.pem").write_bytes(
            key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
        (home / "token").write_text(TOKEN)
        requirements = (next(iter(models.values()))["folder"] / "requirements.txt").read_text().split()
        venvs = {
            "edge": _venv("edge-runtime", [str(EDGE_SOURCE)], _source_digest(EDGE_SOURCE)),
            "mlflow": _venv("mlflow-model", requirements),
        }
        rows: list[dict[str, Any]] = []
        for key_name, model in models.items():
            built = bundling.build(
                model["uri"], model["name"], model["version"], model["inputs"], model["held_out"], key,
                home / f"{key_name}.tar",
            )  # fmt: skip
            sample = model["held_out"][model["inputs"]].head(1)  # its own dtypes: MLflow enforces the signature's
            expected = model["estimator"].predict_proba(sample)[0].tolist()
            body = json.dumps({"dataframe_split": json.loads(sample.to_json(orient="split", index=False))})
            for kind in ("edge", "mlflow"):
                port = free_port("127.0.0.1")
                url = f"http://127.0.0.1:{port}"
                if kind == "edge":
                    folder = Path(tempfile.mkdtemp(dir=home))
                    cmd = [str(venvs["edge"] / "bin" / "tollfree-edge"), "--folder", str(folder), "--public-key",
                           str(home / "public.pem"), "--token-file", str(home / "token"), "--port", str(port),
                           "--bundle", str(built.archive)]  # fmt: skip
                    headers = {"Authorization": f"Bearer {TOKEN}"}
                else:
                    cmd = [str(venvs["mlflow"] / "bin" / "mlflow"), "models", "serve", "-m", model["uri"],
                           "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]  # fmt: skip
                    headers = {}
                env = {
                    **os.environ,
                    "PATH": f"{venvs[kind] / 'bin'}:{os.environ['PATH']}",
                }  # mlflow runs uvicorn by name
                server = start_session(kind, cmd, env, url, headers, home / "logs" / f"{kind}-{key_name}.log")
                try:
                    rows.append(_measure(server, kind, key_name, body, expected, args.seconds, home))
                finally:
                    server.stop()
            rows[-2]["bundle_bytes"] = built.archive.stat().st_size
            rows[-1]["model_folder_bytes"] = _bytes(model["folder"])
        venv_bytes = {kind: _bytes(path) for kind, path in venvs.items()}
        return {**provenance.record(), "seconds_timed": args.seconds, "rows": rows, "venv_bytes": venv_bytes}
    except BaseException:
        kept = Path(tempfile.gettempdir()) / "tollfree-bench-edge-logs"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.copytree(home / "logs", kept)
        log(f"the servers' logs are kept in {kept}")
        raise
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _measure(server: Server, kind: str, model: str, body: str, expected: list[float], seconds: int, home: Path) -> dict:
    import httpx

    answer = httpx.post(
        server.url + server.path,
        content=body,
        headers={"content-type": "application/json", **server.headers},
        timeout=30,
    )
    got = answer.json()["predictions"][0]
    if answer.status_code != 200 or max(abs(a - b) for a, b in zip(got, expected)) > 1e-4:
        raise RuntimeError(f"{kind} on {model}: answered {answer.status_code} {answer.text[:200]}, expected {expected}")
    wrk(server, body, 1, WARMUP_S, home / "wrk.lua")
    result = wrk(server, body, 1, seconds, home / "wrk.lua")
    errors = sum(result[k] for k in ("non2xx", "connect", "read", "write", "timeout"))
    row = {"model": model, "server": kind, "requests": result["requests"], "errors": errors,
           "p50_ms": result["p50_us"] / 1000, "p99_ms": result["p99_us"] / 1000, **_memory(server.pid)}  # fmt: skip
    log(f"{model} {kind}: p50 {row['p50_ms']:.2f} ms, PSS {row['pss_mib']} MiB, RSS {row['rss_mib']} MiB")
    return row


def render(report: dict[str, Any]) -> str:
    lines = ["model   server  p50 ms  p99 ms  PSS MiB  RSS MiB  procs  requests"]
    for r in report["rows"]:
        lines.append(
            f"{r['model']:<7} {r['server']:<7} {r['p50_ms']:>6.2f}  {r['p99_ms']:>6.2f}  {r['pss_mib']:>7}  "
            f"{r['rss_mib']:>7}  {r['processes']:>5}  {r['requests']:>8}"
        )
    for model in sorted({r["model"] for r in report["rows"]}):
        edge, peer = (
            next(r for r in report["rows"] if r["model"] == model and r["server"] == s) for s in ("edge", "mlflow")
        )
        memory, p50 = peer["pss_mib"] / edge["pss_mib"], peer["p50_ms"] / edge["p50_ms"]
        lines.append(
            f"{model}: memory {memory:.1f}x lower (PSS), p50 {p50:.1f}x lower; bundle {edge['bundle_bytes']:,} bytes, "
            f"MLflow model folder {peer['model_folder_bytes']:,} bytes"
        )
    v = report["venv_bytes"]
    lines.append(
        f"virtualenvs: edge runtime {v['edge']:,} bytes, the model's mlflow requirements {v['mlflow']:,} bytes"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--models", default="demo,light")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    args.argv = argv
    args.models = [m for m in args.models.split(",") if m]
    if not set(args.models) <= {"demo", "light"} or not args.models:
        parser.error("--models: demo and/or light")
    report = run(args)
    print(json.dumps(report) if args.json else render(report))
    if args.json:
        log(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
