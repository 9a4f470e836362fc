"""Several regions on one machine: ``python -m infra.regions up|down|status [--regions N]`` (``make up REGIONS=2``).

Each region is a whole local stack (``infra.stack``) of its own: state folder ``$TOLLFREE_HOME/regions/NAME``,
its own registry, feature store, gateway, Prefect and ports (region ``a`` on the usual ports, each next region on
the same ports plus 100, 200, ...). The regions share no file and reach each other over HTTP only.
Region ``a`` is the primary: its deployments copy each promoted champion into the other regions' registries
(``flows.replicate``, ``TOLLFREE_REPLICATE_TO``), and every region applies ``$TOLLFREE_HOME/regions/endpoints.yaml``
every 5 minutes (``flows.apply``, ``TOLLFREE_ENDPOINTS_FILE``; a copy of ``infra/endpoints.yaml`` when absent), so
a promotion in ``a`` is served in every region. ``status`` shows each region's stack and every model's champion
per region, flagging a region whose champion is not a copy of the primary's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infra.stack_config import HOST, PORT_DEFAULTS
from serving.settings import Settings

PORT_STEP = 100
MAX_REGIONS = 5
ENDPOINTS_EXAMPLE = Path(__file__).resolve().parent / "endpoints.yaml"  # the demo's endpoint


@dataclass(frozen=True)
class Region:
    name: str
    home: Path
    ports: dict[str, int]  # the stack's port variables, and TOLLFREE_POSTGRES_PORT

    @property
    def registry(self) -> str:
        return f"http://{HOST}:{self.ports['TOLLFREE_MLFLOW_PORT']}"

    @property
    def gateway(self) -> str:
        return f"http://{HOST}:{self.ports['TOLLFREE_GATEWAY_PORT']}"


def layout(root: Path, count: int) -> list[Region]:
    """``count`` regions under ``root``: names a, b, ...; region i's ports are the defaults plus ``100 * i``."""
    if not 2 <= count <= MAX_REGIONS:
        raise ValueError(f"REGIONS must be 2 to {MAX_REGIONS}, got {count}")
    defaults = dict(PORT_DEFAULTS.values()) | {"TOLLFREE_POSTGRES_PORT": 5433}
    return [
        Region(chr(ord("a") + i), root / chr(ord("a") + i), {k: v + PORT_STEP * i for k, v in defaults.items()})
        for i in range(count)
    ]


def region_environ(region: Region, regions: list[Region], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment ``infra.stack`` runs with for ``region``: its state folder, ports, replication targets."""
    env = {k: v for k, v in environ.items() if k not in ("MLFLOW_TRACKING_URI", "TOLLFREE_STATE_URL")}
    env.update({k: str(v) for k, v in region.ports.items()})
    env["TOLLFREE_HOME"] = str(region.home)
    env["TOLLFREE_ENDPOINTS_FILE"] = str(region.home.parent / "endpoints.yaml")
    if region is regions[0]:
        env["TOLLFREE_REPLICATE_TO"] = ",".join(r.registry for r in regions[1:])
    else:
        env.pop("TOLLFREE_REPLICATE_TO", None)
    return env


def champions_table(champions: dict[str, dict[str, tuple[str, str]]]) -> list[str]:
    """Lines of every model's champion per region (``region -> model -> (version, source key)``), each model
    flagged when a region's champion is not the primary's (the first region's) version or a copy of it."""
    names = list(champions)
    primary = champions[names[0]] if names else {}
    lines = []
    for model in sorted({m for per_region in champions.values() for m in per_region}):
        cells, same = [], True
        for region in names:
            found = champions[region].get(model)
            cells.append(f"{region}: v{found[0]}" if found else f"{region}: -")
            same &= found is not None and model in primary and found[1] == primary[model][1]
        lines.append(f"  {model:<20} {'  '.join(cells)}  {'same version' if same else 'DIFFERS'}")
    return lines


def _champions(region: Region) -> dict[str, tuple[str, str]]:
    """model -> (champion version, the key of the version it copies, or its own) in the region's registry."""
    from mlflow import MlflowClient

    from serving.registry.replication import SOURCE_TAG

    client = MlflowClient(region.registry, region.registry)
    out = {}
    for model in client.search_registered_models():
        version = model.aliases.get("champion")
        if version is None:
            continue
        found = client.get_model_version(model.name, str(version))
        out[model.name] = (str(version), found.tags.get(SOURCE_TAG) or f"{model.name}/{version}@{found.run_id}")
    return out


def _stack(command: str, env: Mapping[str, str]) -> int:
    return subprocess.run([sys.executable, "-m", "infra.stack", command], env=dict(env), check=False).returncode


def _record(root: Path) -> list[Region] | None:
    path = root / "regions.json"
    if not path.exists():
        return None
    return [Region(r["name"], Path(r["home"]), r["ports"]) for r in json.loads(path.read_text())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.regions", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument("--regions", type=int, default=2)
    args = parser.parse_args(argv)
    root = Settings.from_environ(os.environ).home / "regions"
    recorded = _record(root)
    if args.command != "up" and recorded is None:  # one region: the plain stack, in this process
        from infra import stack

        return stack.main([args.command])
    try:
        regions = recorded if recorded is not None and args.command != "up" else layout(root, args.regions)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.command == "up":
        if recorded is not None and [r.name for r in recorded] != [r.name for r in regions]:
            print(f"error: {len(recorded)} regions run; make down first to change REGIONS", file=sys.stderr)
            return 1
        root.mkdir(parents=True, exist_ok=True)
        endpoints = root / "endpoints.yaml"
        if not endpoints.exists():
            endpoints.write_text(ENDPOINTS_EXAMPLE.read_text())
        records = [{"name": r.name, "home": str(r.home), "ports": r.ports} for r in regions]
        (root / "regions.json").write_text(json.dumps(records, indent=1))
    codes = []
    for region in regions:
        print(f"== region {region.name} ({region.home}) ==", flush=True)
        codes.append(_stack(args.command, region_environ(region, regions, os.environ)))
    if args.command == "down":
        (root / "regions.json").unlink(missing_ok=True)
    if args.command == "status":
        print("champions by region:")
        try:
            print("\n".join(champions_table({r.name: _champions(r) for r in regions})) or "  (none yet)")
        except Exception as exc:  # a registry that does not answer: the stacks' lines above say which
            print(f"  not readable: {type(exc).__name__}")
            codes.append(3)
    return max(codes)


if __name__ == "__main__":
    raise SystemExit(main())
