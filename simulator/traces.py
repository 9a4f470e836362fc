"""Request-arrival traces: loaded from CSV, rescaled keeping their shape, or generated.

A :class:`Trace` is sorted arrival times in seconds from 0, optionally each request's service time.
CSV files hold one row per request with a ``timestamp`` column (any case; seconds, or ISO times such
as ``2023-11-16 18:17:03.9799600`` in the Azure traces) and optionally ``service_ms``.

Rate scaling keeps the shape: :meth:`Trace.compress` divides time (bursts get shorter, the day fits in
minutes); :meth:`Trace.superpose` overlays ``k`` copies each shifted by a small random offset, which
multiplies the rate without moving features longer than the offset.

Synthetic generators (seeded, non-homogeneous Poisson): ``spike`` (10x within 5 s), ``ramp``
(10 -> 10,000 QPS), ``diurnal`` (a day compressed), ``onoff`` (bursts); and three shapes kept for the
autoscaler benchmark's held-out set: ``bursty`` (two states of random length), ``sawtooth`` (repeated
slow ramps) and ``flash`` (flash crowds that decay). Each sets ``step_at`` and ``step_rate`` when it
has a step, so the simulator can time how long capacity takes to catch up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Trace:
    name: str
    arrivals: np.ndarray  # seconds from 0, sorted
    service_ms: np.ndarray | None = None
    step_at: float | None = None  # when the load steps up (for time-to-capacity)
    step_rate: float | None = None  # the rate after the step (requests/s)
    note: str = ""

    def __post_init__(self) -> None:
        if self.arrivals.ndim != 1 or len(self.arrivals) == 0:
            raise ValueError(f"trace {self.name!r}: no requests")
        if self.service_ms is not None and len(self.service_ms) != len(self.arrivals):
            raise ValueError(f"trace {self.name!r}: service_ms and arrivals differ in length")

    @property
    def duration_s(self) -> float:
        return float(self.arrivals[-1])

    @property
    def mean_rps(self) -> float:
        return len(self.arrivals) / max(self.duration_s, 1e-9)

    def rate_per_second(self) -> np.ndarray:
        return np.bincount(self.arrivals.astype(np.int64))

    def compress(self, factor: float) -> Trace:
        """Time divided by ``factor``: the rate times ``factor``, the whole shape kept, faster."""
        if factor <= 0:
            raise ValueError("compress factor must be positive")
        return replace(
            self,
            name=f"{self.name}/c{factor:g}",
            arrivals=self.arrivals / factor,
            step_at=None if self.step_at is None else self.step_at / factor,
            step_rate=None if self.step_rate is None else self.step_rate * factor,
            note=(self.note + f"; time compressed {factor:g}x").lstrip("; "),
        )

    def superpose(self, copies: int, max_shift_s: float, seed: int) -> Trace:
        """``copies`` overlaid copies, each shifted by U(0, max_shift_s) seconds (wrapping at the end)."""
        if copies < 1:
            raise ValueError("copies must be >= 1")
        rng = np.random.default_rng(seed)
        span = self.duration_s + 1e-6
        parts = [self.arrivals]
        services = [self.service_ms] if self.service_ms is not None else None
        for _ in range(copies - 1):
            parts.append((self.arrivals + rng.uniform(0, max_shift_s)) % span)
            if services is not None:
                services.append(self.service_ms)
        arr = np.concatenate(parts)
        order = np.argsort(arr, kind="stable")
        svc = np.concatenate(services)[order] if services is not None else None
        return replace(
            self,
            name=f"{self.name}/x{copies}",
            arrivals=arr[order],
            service_ms=svc,
            step_rate=None if self.step_rate is None else self.step_rate * copies,
            note=(self.note + f"; {copies} copies superposed, shifts up to {max_shift_s:g}s").lstrip("; "),
        )

    def scale_to(self, mean_rps: float, seed: int, max_compress: float = 6.0, max_shift_s: float = 2.0) -> Trace:
        """Reach ``mean_rps``: compress time up to ``max_compress``x, then superpose shifted copies."""
        factor = min(max_compress, max(1.0, mean_rps / self.mean_rps))
        out = self.compress(factor) if factor > 1 else self
        copies = max(1, round(mean_rps / out.mean_rps))
        return out.superpose(copies, max_shift_s, seed) if copies > 1 else out


def load_csv(path: str | Path, name: str | None = None) -> Trace:
    """A trace from a CSV with a ``timestamp`` column (seconds or ISO time) and optional ``service_ms``."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist")
    frame = pd.read_csv(path)
    cols = {c.lower(): c for c in frame.columns}
    if "timestamp" not in cols:
        raise ValueError(f"trace file {path}: no 'timestamp' column (columns: {list(frame.columns)})")
    raw = frame[cols["timestamp"]]
    if pd.api.types.is_numeric_dtype(raw):
        seconds = raw.to_numpy(dtype=np.float64)
    else:
        try:
            stamps = pd.to_datetime(raw, format="mixed")
        except (ValueError, TypeError) as exc:
            raise ValueError(f"trace file {path}: timestamp is neither seconds nor an ISO time ({exc})") from None
        seconds = (stamps - stamps.min()).dt.total_seconds().to_numpy()
    if np.isnan(seconds).any():
        raise ValueError(f"trace file {path}: empty timestamps")
    service = None
    if "service_ms" in cols:
        service = frame[cols["service_ms"]].to_numpy(dtype=np.float64)
        if (service <= 0).any() or np.isnan(service).any():
            raise ValueError(f"trace file {path}: service_ms must be positive numbers")
    order = np.argsort(seconds, kind="stable")
    seconds = seconds[order] - seconds[order][0]
    return Trace(name=name or path.stem, arrivals=seconds, service_ms=None if service is None else service[order])


def from_rate(name: str, rate: Callable[[np.ndarray], np.ndarray], duration_s: float, seed: int, **kw) -> Trace:
    """A non-homogeneous Poisson trace with ``rate(t)`` requests/s, drawn per 100 ms."""
    rng = np.random.default_rng(seed)
    dt = 0.1
    edges = np.arange(0.0, duration_s, dt)
    counts = rng.poisson(np.maximum(rate(edges + dt / 2), 0.0) * dt)
    starts = np.repeat(edges, counts)
    arr = np.sort(starts + rng.uniform(0.0, dt, size=starts.size))
    return Trace(name=name, arrivals=arr, **kw)


def spike(base_rps: float = 300.0, seed: int = 0) -> Trace:
    """``base_rps`` for 120 s, up 10x within 5 s, held 180 s, back down for 180 s."""

    def rate(t: np.ndarray) -> np.ndarray:
        up = np.clip((t - 120.0) / 5.0, 0.0, 1.0)
        down = t >= 300.0
        return np.where(down, base_rps, base_rps * (1 + 9 * up))

    return from_rate(
        "spike",
        rate,
        480.0,
        seed,
        step_at=120.0,
        step_rate=10 * base_rps,
        note=f"{base_rps:g} rps, 10x within 5 s at t=120 s for 180 s",
    )


def ramp(low_rps: float = 10.0, high_rps: float = 10_000.0, ramp_s: float = 30.0, seed: int = 0) -> Trace:
    """``low_rps`` for 60 s, linear to ``high_rps`` over ``ramp_s``, held 150 s."""

    def rate(t: np.ndarray) -> np.ndarray:
        return low_rps + (high_rps - low_rps) * np.clip((t - 60.0) / ramp_s, 0.0, 1.0)

    return from_rate(
        "ramp",
        rate,
        60.0 + ramp_s + 150.0,
        seed,
        step_at=60.0,
        step_rate=high_rps,
        note=f"{low_rps:g} -> {high_rps:g} rps over {ramp_s:g} s at t=60 s",
    )


def diurnal(mean_rps: float = 1000.0, day_s: float = 1200.0, seed: int = 0) -> Trace:
    """One day compressed into ``day_s``: night trough at 20 %, morning and evening peaks."""

    def rate(t: np.ndarray) -> np.ndarray:
        h = 24.0 * t / day_s
        shape = 0.2 + 0.8 * np.exp(-(((h - 11.0) / 3.0) ** 2)) + 0.9 * np.exp(-(((h - 19.0) / 2.5) ** 2))
        return mean_rps * shape / 0.62

    return from_rate("diurnal", rate, day_s, seed, note=f"a day in {day_s:g} s, mean ~{mean_rps:g} rps")


def onoff(
    on_rps: float = 2000.0,
    off_rps: float = 20.0,
    on_s: float = 60.0,
    off_s: float = 120.0,
    cycles: int = 4,
    seed: int = 0,
) -> Trace:
    """Bursts: ``on_rps`` for ``on_s`` then ``off_rps`` for ``off_s``, ``cycles`` times (starting off)."""
    period = on_s + off_s

    def rate(t: np.ndarray) -> np.ndarray:
        phase = t % period
        return np.where(phase >= off_s, on_rps, off_rps)

    return from_rate(
        "onoff",
        rate,
        period * cycles,
        seed,
        step_at=off_s,
        step_rate=on_rps,
        note=f"{cycles} x ({off_s:g} s at {off_rps:g} rps, {on_s:g} s at {on_rps:g} rps)",
    )


def bursty(
    low_rps: float = 200.0,
    high_rps: float = 2000.0,
    low_mean_s: float = 40.0,
    high_mean_s: float = 20.0,
    duration_s: float = 900.0,
    seed: int = 0,
) -> Trace:
    """Two states, ``low_rps`` and ``high_rps``, each held for an exponentially distributed time (means
    ``low_mean_s`` and ``high_mean_s``): a Markov-modulated Poisson process, bursts of random length at
    random times (starting low)."""
    rng = np.random.default_rng(seed + 104729)
    edges, high, t = [], [], 0.0
    while t < duration_s:
        on = len(edges) % 2 == 1
        edges.append(t)
        high.append(on)
        t += rng.exponential(high_mean_s if on else low_mean_s)
    starts, levels = np.array(edges), np.where(np.array(high), high_rps, low_rps)

    def rate(x: np.ndarray) -> np.ndarray:
        return levels[np.searchsorted(starts, x, side="right") - 1]

    return from_rate(
        "bursty",
        rate,
        duration_s,
        seed,
        note=f"{low_rps:g} / {high_rps:g} rps, states held ~{low_mean_s:g} / ~{high_mean_s:g} s (exponential)",
    )


def sawtooth(
    low_rps: float = 200.0,
    high_rps: float = 2000.0,
    rise_s: float = 240.0,
    hold_s: float = 30.0,
    cycles: int = 3,
    seed: int = 0,
) -> Trace:
    """Repeated slow ramps: ``low_rps`` up to ``high_rps`` over ``rise_s``, held ``hold_s``, straight back
    down, ``cycles`` times. Each ramp is slower than a scale-up window, each drop faster than any
    scale-down window."""
    period = rise_s + hold_s

    def rate(t: np.ndarray) -> np.ndarray:
        phase = t % period
        return low_rps + (high_rps - low_rps) * np.clip(phase / rise_s, 0.0, 1.0)

    return from_rate(
        "sawtooth",
        rate,
        period * cycles,
        seed,
        note=f"{cycles} x ({low_rps:g} -> {high_rps:g} rps over {rise_s:g} s, held {hold_s:g} s, drop)",
    )


def flash(
    base_rps: float = 200.0,
    peak_rps: float = 4000.0,
    decay_s: float = 60.0,
    at_s: tuple = (150.0, 600.0),
    duration_s: float = 900.0,
    seed: int = 0,
) -> Trace:
    """Flash crowds: ``base_rps``, and at each time of ``at_s`` a jump to ``peak_rps`` within 2 s that
    decays back exponentially (time constant ``decay_s``), as a link shared widely."""
    jitter = np.random.default_rng(seed + 7877).uniform(-30.0, 30.0, len(at_s))
    times = np.asarray(at_s) + jitter

    def rate(t: np.ndarray) -> np.ndarray:
        out = np.full_like(t, base_rps)
        for t0 in times:
            dt = t - t0
            rise = np.clip(dt / 2.0, 0.0, 1.0)
            out = out + (peak_rps - base_rps) * rise * np.exp(-np.maximum(dt - 2.0, 0.0) / decay_s)
        return out

    return from_rate(
        "flash",
        rate,
        duration_s,
        seed,
        step_at=float(times[0]),
        step_rate=peak_rps,
        note=f"{base_rps:g} rps, jumps to {peak_rps:g} within 2 s decaying over ~{decay_s:g} s, "
        f"at t={', '.join(f'{x:.0f}' for x in times)} s",
    )


SYNTHETIC: dict[str, Callable[..., Trace]] = {
    "spike": spike,
    "ramp": ramp,
    "diurnal": diurnal,
    "onoff": onoff,
    "bursty": bursty,
    "sawtooth": sawtooth,
    "flash": flash,
}


def resolve(spec: str, seed: int = 0, rate_scale: float = 1.0, mean_rps: float | None = None) -> Trace:
    """A synthetic name (``spike``...), or a CSV path; ``mean_rps`` rescales a CSV keeping its shape."""
    if spec in SYNTHETIC:
        gen = SYNTHETIC[spec]
        if rate_scale == 1.0:
            return gen(seed=seed)
        # scale every rate argument by the same factor (shape kept)
        import inspect

        params = {k: v.default * rate_scale for k, v in inspect.signature(gen).parameters.items() if k.endswith("_rps")}
        return gen(seed=seed, **params)
    trace = load_csv(spec)
    if mean_rps is not None:
        trace = trace.scale_to(mean_rps, seed=seed)
    elif rate_scale != 1.0:
        trace = trace.scale_to(trace.mean_rps * rate_scale, seed=seed)
    return trace
