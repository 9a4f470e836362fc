"""``Sample``'s contract, met by both of its producers: the live gateway (``GatewaySignals`` over a real
``Dispatcher``) and the simulator (``engine.simulate``). The same load on the same serial model (50 ms a
request, one at a time, four admitted per replica) must read alike: the service time the policy derives
(busy requests over completions) is the model's, not its latency; what waits inside a replica is queued;
arrivals, completions and utilisation agree."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from serving.autoscaler.load import service_s
from serving.autoscaler.signals import Sample
from serving.gateway.scaling_signals import GatewaySignals
from serving.protocol.wire import WireAnswer, WireReply, WireRequest
from serving.traffic.dispatcher import Dispatcher
from simulator.engine import Action, View, simulate
from simulator.interface import INF
from simulator.profiles import ModelProfile
from simulator.traces import Trace

SERVICE_S = 0.05
LIMIT = 4  # per replica: admitted at once, one predicted, three waiting inside it
RATE = 16.0  # requests a second: 80 % of the replica's 20 a second


class SerialReplica:
    """One replica that predicts one call at a time (its one predict thread) and keeps a busy clock."""

    def __init__(self) -> None:
        self.url, self.outstanding, self.pid, self.id = "serial", 0, None, "fake:serial"
        self.lock = asyncio.Lock()
        self.busy_s = 0.0
        self.calls = 0

    def alive(self) -> bool:
        return True

    async def send(self, replica: SerialReplica, requests: list[WireRequest]) -> WireReply:
        async with self.lock:
            began = time.monotonic()
            await asyncio.sleep(SERVICE_S * len(requests))
            self.busy_s += time.monotonic() - began
            self.calls += len(requests)
        return WireReply([WireAnswer(200, 1, b"[1]", b"") for _ in requests], self.busy_s)


def gateway_samples(seconds: int, rate: float) -> tuple[list[Sample], float]:
    """Poisson arrivals at ``rate`` into a real dispatcher for ``seconds``; ``GatewaySignals`` samples each second.
    Also the replica's own mean predict time (a busy machine oversleeps: that, not SERVICE_S, is the truth)."""

    async def run() -> tuple[list[Sample], float]:
        replica = SerialReplica()
        dispatcher = Dispatcher(replica.send, lambda: [replica], limit=lambda: LIMIT, max_queue=1000)
        entity = SimpleNamespace(
            dispatcher=dispatcher, replicas=[replica], starting=0, model_uri="m", ready_in_s=lambda: 0.0
        )
        manager = SimpleNamespace(live={"ep": SimpleNamespace(replica_sets={"m": entity})})
        signals = GatewaySignals(manager)  # type: ignore[arg-type]
        gaps = iter(np.random.default_rng(3).exponential(1 / rate, int(rate * seconds * 3)))
        tasks, samples, start = [], [], time.monotonic()
        next_at, next_sample = start, start + 1.0
        while time.monotonic() < start + seconds:
            now = time.monotonic()
            if now >= next_at:
                tasks.append(asyncio.ensure_future(dispatcher.submit(WireRequest("q", "application/json", b"{}"))))
                next_at += next(gaps)
            if now >= next_sample:
                samples.append(signals.sample(now)[("ep", "m")])
                next_sample += 1.0
            await asyncio.sleep(max(0.0, min(next_at, next_sample) - time.monotonic()))
        await asyncio.gather(*tasks)
        return samples, replica.busy_s / max(1, replica.calls)

    return asyncio.run(run())


class FixedOne:
    """A simulator policy that holds one replica admitting ``LIMIT``, and keeps each second's Sample."""

    name, warm_pool, front_queue, replica_queue, timeout_s = "one", 0.0, INF, 0.0, None

    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def initial(self, load: float) -> tuple[int, int | None]:
        return 1, LIMIT

    def step(self, view: View) -> Action | None:
        if view.second is not None:
            self.samples.append(view.second)
        return None


def simulated_samples(seconds: int, rate: float, profile: ModelProfile) -> list[Sample]:
    arrivals = np.cumsum(np.random.default_rng(3).exponential(1 / rate, int(rate * seconds)))
    policy = FixedOne()
    simulate(Trace("poisson", arrivals[arrivals < seconds]), profile, policy, seed=0)
    return [s for s in policy.samples if s.t <= seconds]


SERIAL = ModelProfile(
    name="serial", service_ms=SERVICE_S * 1000, service_sigma=0.0, parallelism=1, slo_ms=500.0, user_target=1.0
)


@pytest.mark.parametrize("producer", ["gateway", "simulator"])
def test_both_producers_read_the_model_s_service_time_and_count_waits_inside_a_replica_as_queued(producer: str) -> None:
    if producer == "gateway":
        samples, truth = gateway_samples(6, RATE)
    else:
        samples, truth = simulated_samples(6, RATE, SERIAL), SERVICE_S
    samples = samples[1:]
    measured = service_s(tuple(samples))
    arrivals = sum(s.requests for s in samples) / len(samples)
    utilisation = [s.utilisation for s in samples if s.utilisation is not None]
    print(
        f"{producer}: service {measured}, arrivals/s {arrivals:.1f}, utilisation {np.mean(utilisation):.2f}, "
        f"in flight {np.mean([s.in_flight for s in samples]):.2f}, "
        f"queued {np.mean([s.queue_depth for s in samples]):.2f}"
    )
    assert measured == pytest.approx(truth, rel=0.2)  # not the latency, which includes the waits
    assert all(0 <= s.queue_depth <= s.in_flight + 1e-9 for s in samples)
    assert all(s.in_flight - s.queue_depth <= 1 + 1e-6 for s in samples)  # one predicted at a time
    assert arrivals == pytest.approx(RATE, rel=0.35)
    assert utilisation and np.mean(utilisation) == pytest.approx(arrivals * truth, abs=0.25)
    assert all(s.ready_replicas == 1 and s.stream_backlog_per_s == 0.0 for s in samples)


def test_a_shared_machine_s_cores_and_their_busy_share_come_from_the_simulator_as_from_the_gateway() -> None:
    """The gateway's samples carry the machine's cores and busy share for local replicas (``MachineCpu``); the
    simulator's do for a profile whose replicas share a machine, and stretch the services when it is overbooked."""
    shared = ModelProfile(
        name="shared",
        service_ms=SERVICE_S * 1000,
        service_sigma=0.0,
        parallelism=4,
        slo_ms=500.0,
        user_target=1.0,
        machine_cores=2,
        cpu_share=1.0,
    )
    samples = simulated_samples(6, 70.0, shared)[1:]
    assert all(s.cores == 2 and s.cores_busy is not None and 0 <= s.cores_busy <= 1 for s in samples)
    # 70 a second of 50 ms on 4 servers but 2 cores: the cores are saturated and the service time stretched
    assert np.mean([s.cores_busy for s in samples]) > 0.9
    assert service_s(tuple(samples)) > 1.3 * SERVICE_S
    alone = simulated_samples(6, 70.0, SERIAL)[1:]
    assert all(s.cores == 0 and s.cores_busy is None for s in alone)
