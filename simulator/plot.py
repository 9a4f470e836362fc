"""Load, replicas and p99 over time, one line per policy (matplotlib, when installed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from simulator.engine import Result


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def plot(results: Mapping[str, Result], path: str | Path, title: str = "") -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise PlotUnavailable("--plot needs matplotlib, which is not installed in this environment") from exc
    path = Path(path)
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    first = next(iter(results.values()))
    axes[0].plot(first.timeline["t"], first.timeline["rps"], color="black", linewidth=0.8)
    axes[0].set_ylabel("load (req/s)")
    for name, result in results.items():
        tl = result.timeline
        axes[1].plot(tl["t"], tl["replicas"], label=name, linewidth=1.0)
        axes[2].plot(tl["t"], tl["p99_ms"], label=name, linewidth=0.8)
    axes[1].set_ylabel("replicas")
    axes[1].set_yscale("symlog", linthresh=10)  # linear to 10, then logarithmic: a few and hundreds both show
    axes[2].set_ylabel("p99 over 1 s (ms)")
    axes[2].set_yscale("log")
    axes[2].axhline(first_slo(results), color="grey", linestyle="--", linewidth=0.8)
    axes[2].set_xlabel("simulated time (s)")
    axes[1].legend(loc="upper left", fontsize="small")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def first_slo(results: Mapping[str, Result]) -> float:
    return next(iter(results.values())).timeline.get("slo_ms", float("nan"))
