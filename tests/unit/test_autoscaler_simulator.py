"""The simulator: deterministic per seed, traces and profiles load, the CLI works, and the tollfree
policy beats HPA's defaults on a spike (an outcome, not a timing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simulator import traces as tr
from simulator.__main__ import main
from simulator.engine import simulate
from simulator.policies import make_policy
from simulator.profiles import PRESETS, load_profile


def small_spike(seed: int = 0) -> tr.Trace:
    return tr.spike(base_rps=60.0, seed=seed)


def test_the_simulator_is_deterministic_for_a_seed():
    profile = PRESETS["cpu"]
    a = simulate(small_spike(), profile, make_policy("tollfree", profile), seed=3).summary()
    b = simulate(small_spike(), profile, make_policy("tollfree", profile), seed=3).summary()
    c = simulate(small_spike(), profile, make_policy("tollfree", profile), seed=4).summary()
    assert a == b
    assert a != c


@pytest.mark.slow
def test_tollfree_beats_hpa_defaults_on_a_10x_spike():
    profile = PRESETS["cpu"]
    trace = tr.spike(base_rps=150.0, seed=1)
    hpa = simulate(trace, profile, make_policy("hpa", profile), seed=1, warmup_s=120, timeline=False)
    # the shipped defaults (the gateway holds the excess: answered late, 2.3x when measured), and with
    # shedding (6.2x); both with the gateway's one standby
    for shed, factor in ((False, 2), (True, 5)):
        mine = simulate(
            trace, profile, make_policy("tollfree", profile, shed_load=shed), seed=1, warmup_s=120, timeline=False
        )
        assert mine.bad * factor < hpa.bad, (shed, mine.bad, hpa.bad)
        assert mine.replica_seconds <= hpa.replica_seconds
        assert mine.time_to_capacity_s is not None and mine.time_to_capacity_s < hpa.time_to_capacity_s


def test_every_request_is_accounted_for():
    profile = PRESETS["embedding"]
    trace = tr.onoff(on_rps=400.0, off_rps=5.0, cycles=1, seed=2)
    for name in ("tollfree", "hpa", "kpa", "ray"):
        r = simulate(trace, profile, make_policy(name, profile), seed=2, timeline=True)
        assert r.requests == len(trace.arrivals)
        assert 0 <= r.rejected + r.over_slo <= r.requests
        assert len(r.timeline["t"]) == len(r.timeline["replicas"]) > 0


def test_csv_traces_load_with_iso_or_seconds_and_keep_their_shape_when_rescaled(tmp_path):
    iso = tmp_path / "iso.csv"
    iso.write_text(
        "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,1\n2023-11-16 18:17:05.4799600,2\n"
        "2023-11-16 18:17:04.0000000,3\n"
    )
    t = tr.load_csv(iso)
    assert np.allclose(t.arrivals, [0.0, 0.02004, 1.5], atol=1e-4)
    secs = tmp_path / "s.csv"
    secs.write_text("timestamp,service_ms\n10,5\n12,7\n11,6\n")
    s = tr.load_csv(secs)
    assert list(s.arrivals) == [0.0, 1.0, 2.0] and list(s.service_ms) == [5.0, 6.0, 7.0]
    assert s.compress(2.0).duration_s == pytest.approx(1.0)
    up = tr.from_rate("r", lambda x: np.full_like(x, 50.0), 100.0, seed=0).superpose(4, 1.0, seed=0)
    counts = up.rate_per_second()
    assert len(up.arrivals) == pytest.approx(4 * 5000, rel=0.05) and counts.mean() == pytest.approx(200, rel=0.05)


def test_bad_traces_and_profiles_are_refused_naming_what_is_wrong(tmp_path):
    no_ts = tmp_path / "bad.csv"
    no_ts.write_text("time,x\n1,2\n")
    with pytest.raises(ValueError, match="timestamp"):
        tr.load_csv(no_ts)
    prof = tmp_path / "p.yaml"
    prof.write_text("service_ms: 10\nservice_sigma: 0.1\nparallelism: 2\nslo_ms: 100\nuser_target: 1.5\nwarp: 9\n")
    with pytest.raises(ValueError, match="warp"):
        load_profile(str(prof))
    prof.write_text("service_ms: 10\nservice_sigma: 0.1\nparallelism: 2\nslo_ms: 100\nuser_target: 1.5\n")
    assert load_profile(str(prof)).name == "p"
    with pytest.raises(ValueError, match="neither a preset"):
        load_profile("no-such-profile")


@pytest.mark.slow
def test_cli_prints_one_json_object_keyed_by_policy_and_draws_a_plot(tmp_path, capsys):
    csv = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    csv.write_text("timestamp\n" + "\n".join(f"{x:.4f}" for x in np.sort(rng.uniform(0, 60, 3000))))
    assert main(["--trace", str(csv), "--policy", "all", "--json", "--seed", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"tollfree", "hpa", "kpa", "ray"}
    assert {
        "replica_seconds",
        "over_slo_share",
        "rejected",
        "p50_ms",
        "p99_ms",
        "time_to_capacity_s",
        "scale_events",
    } <= set(out["hpa"])
    png = tmp_path / "plot.png"
    assert main(["--trace", str(csv), "--policy", "hpa", "--plot", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert main(["--trace", str(csv), "--profile", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


class _Fixed:
    """One replica, a fixed per-replica admission limit, an unbounded front queue, a 1 s timeout."""

    name = "fixed"
    warm_pool = 0
    front_queue = float("inf")
    replica_queue = 0.0
    timeout_s = 1.0

    def __init__(self, limit):
        self.limit = limit

    def initial(self, load):
        return 1, self.limit

    def step(self, view):
        return None


@pytest.mark.parametrize("limit, served_rps", [(None, 692), (5, 247)])
def test_a_batching_models_batch_holds_no_more_than_the_admission_limit(limit, served_rps):
    # the embedding model batches up to 64 (692 req/s a replica); a replica that may hold only 5 in
    # flight (Ray Serve's default max_ongoing_requests) forms batches of 5 at most: ~247 req/s
    profile = PRESETS["embedding"]
    assert profile.replica_rps(limit) == pytest.approx(served_rps, rel=0.01)
    trace = tr.from_rate("constant", lambda t: np.full_like(t, 500.0), 60.0, seed=1)
    r = simulate(trace, profile, _Fixed(limit), seed=1, timeline=False)
    answered = r.requests - r.rejected
    assert answered / trace.duration_s == pytest.approx(min(500.0, served_rps), rel=0.05)
