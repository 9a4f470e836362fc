"""The stream benchmark's figures from what Redis and the gateway report: pacing, drain rate, lag, gauges, recovery."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from serving.streams.broker import entry_ms


def text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def due(rate: float, elapsed_s: float) -> int:
    """Events a producer at ``rate``/s has to have appended ``elapsed_s`` after its start (the first at 0)."""
    return 0 if elapsed_s < 0 else int(rate * elapsed_s + 1e-9) + 1


def drain_rate(sink_ids: Iterable[str]) -> float:
    """Results per second between the first and the last of ``sink_ids`` (by their ms); 0 if under 1 ms apart."""
    ms = sorted(entry_ms(i) for i in sink_ids)
    return (len(ms) - 1) / ((ms[-1] - ms[0]) / 1000) if len(ms) > 1 and ms[-1] > ms[0] else 0.0


def group_lag(groups: list[dict], group: str) -> int | None:
    """The group's unacknowledged entries from XINFO GROUPS (``lag`` + ``pending``); None if missing or unknown."""
    info = next((i for i in ({text(k): v for k, v in g.items()} for g in groups) if text(i.get("name")) == group), None)
    return None if info is None or info.get("lag") is None else int(info["lag"]) + int(info["pending"])


def gauge(metrics: str, name: str, endpoint: str, label: str = "") -> float | None:
    """The sum of a Prometheus family's samples for ``endpoint`` (and ``label``, e.g. ``outcome="retry"``).

    None if there are none.
    """
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith(name + "{") and f'endpoint="{endpoint}"' in line and label in line
    ]
    return sum(values) if values else None


def recovery_s(samples: list[tuple[float, int | None]], since: float, level: float) -> float | None:
    """Seconds from ``since`` to the first sample whose lag is at or below ``level`` again after one above it
    (the burst seen: samples taken while it was still being appended do not count); None: none yet."""
    above = next((t for t, lag in samples if t > since and lag is not None and lag > level), None)
    if above is None:
        return None
    return next((t - since for t, lag in samples if t > above and lag is not None and lag <= level), None)
