"""The discrete-event engine: replays a trace against a model profile and a scaling policy.

Request level and deterministic for a seed. The ready replicas form a pool of servers (``parallelism``
per replica, fewer if the policy's per-replica admission limit is lower) fed from one FIFO in arrival
order, as a gateway that routes each request to the least-loaded replica behaves. A batching
model's batch holds at most what its replica may hold in flight (the admission limit over its
parallelism): a Ray Serve replica gets at most ``max_ongoing_requests``, a tollfree one
``max_concurrency``, and batches form from those. Each server is its
next free time in a heap; a request starts at ``max(arrival, earliest free time)``. Capacity changes
only at step boundaries (every ``STEP_S``), so a start is committed only if it falls before the end of
the current step; later ones wait in the FIFO and are retried at the next step, once the policy has
had its say. Replicas being started are servers whose first free time is their ready time.

The waiting room is what the policy's system puts in front of the model server: ``front_queue``
(a gateway's, router's or activator's queue; INF: unbounded) plus, per ready replica, the requests a
replica admits beyond its parallelism (``admission_limit - parallelism``) and ``replica_queue``
(what waits inside or just in front of a replica: a queue-proxy's breaker queue, say; None: the model
server's own, ``profile.queue_limit``, unbounded unless the profile sets one). A request that finds
the room full is rejected. With ``timeout_s`` set (Knative's revision timeout), a request still
waiting that long after it arrived is answered with a timeout: it counts with the rejected ones.

Policies see what a real one would: every ``STEP_S`` the in-flight count (queued included), what
waits, ready and provisioned replicas; at every full second a :class:`Sample` (means over the second,
latency p50/p99 of the requests completed in it, utilisation = busy share of the replicas' parallel
capacity; on a shared machine its cores and their busy share, ``profile.machine_cores``).
"""

from __future__ import annotations

import math

import numpy as np

from simulator.interface import INF, STEP_S, STEPS_PER_S, TAIL_S, Action, Result, SimPolicy, View
from simulator.pool import Pool
from simulator.profiles import ModelProfile
from simulator.queueing import Requests
from simulator.seconds import Seconds
from simulator.starts import Starts
from simulator.traces import Trace

__all__ = [
    "INF",
    "STEPS_PER_S",
    "STEP_S",
    "TAIL_S",
    "Action",
    "Result",
    "SimPolicy",
    "View",
    "service_times",
    "simulate",
    "with_warmup",
]


def service_times(trace: Trace, profile: ModelProfile, seed: int) -> np.ndarray:
    """Seconds per request: the trace's ``service_ms`` if it has one, else lognormal from the profile."""
    if trace.service_ms is not None:
        return trace.service_ms / 1000.0
    rng = np.random.default_rng(seed)
    return rng.lognormal(math.log(profile.service_ms / 1000.0), profile.service_sigma, len(trace.arrivals))


def with_warmup(trace: Trace, warmup_s: float, seed: int) -> Trace:
    """The trace preceded by ``warmup_s`` of Poisson arrivals at its first 10 s's rate."""
    rng = np.random.default_rng(seed + 7919)
    rate = np.count_nonzero(trace.arrivals < 10.0) / 10.0
    pre = np.sort(rng.uniform(0.0, warmup_s, rng.poisson(rate * warmup_s)))
    svc = None
    if trace.service_ms is not None:
        svc = np.concatenate([rng.choice(trace.service_ms, pre.size), trace.service_ms])
    return Trace(
        name=trace.name,
        arrivals=np.concatenate([pre, trace.arrivals + warmup_s]),
        service_ms=svc,
        step_at=None if trace.step_at is None else trace.step_at + warmup_s,
        step_rate=trace.step_rate,
        note=trace.note,
    )


def simulate(
    trace: Trace, profile: ModelProfile, policy: SimPolicy, seed: int = 0, timeline: bool = True, warmup_s: float = 0.0
) -> Result:
    """Run one policy over one trace; deterministic for ``seed``.

    With ``warmup_s``, the trace is preceded by that long at its initial rate (every policy settles,
    tollfree's vertical axis learns), and nothing of the warm-up is counted or drawn.
    """
    full = with_warmup(trace, warmup_s, seed) if warmup_s > 0 else trace
    n_warm = len(full.arrivals) - len(trace.arrivals)
    run = _Run(full, profile, policy, seed, timeline, warmup_s)
    for k in range(run.n_steps):
        run.step(k)
    result = run.result(n_warm)
    result.trace = trace.name
    return result


class _Run:
    """One policy over one trace, a step at a time: the requests' part of the step (timeouts, the FIFO,
    the arrivals), then what is observed at its end, then the policy's say."""

    def __init__(
        self, trace: Trace, profile: ModelProfile, policy: SimPolicy, seed: int, timeline: bool, warmup_s: float
    ) -> None:
        arrivals = trace.arrivals
        self.trace, self.profile, self.policy, self.warmup_s = trace, profile, policy, warmup_s
        self.batched = profile.max_batch > 1
        end_t = float(arrivals[-1]) + TAIL_S
        self.n_steps = math.ceil(end_t * STEPS_PER_S) + 1
        # arrivals before the end of each step: step k's arrivals are step_ends[k - 1] to step_ends[k]
        self.step_ends = np.searchsorted(arrivals, np.arange(1, self.n_steps + 1) * STEP_S, side="left").tolist()
        self.requests = Requests(arrivals, service_times(trace, profile, seed), self.n_steps, end_t)
        self.seconds = Seconds(profile, timeline, warmup_s)
        self.pool = Pool(profile)
        self.starts = Starts(profile, policy.warm_pool)
        first = arrivals[: max(1, int(np.searchsorted(arrivals, 10.0)))]
        initial_load = len(first) / max(10.0, 1e-9) * profile.mean_service_s
        replicas, self.limit = policy.initial(initial_load)
        self.pool.resize(0.0, 0, self.starts, self.pool.slots_for(self.limit))
        self.pool.ready_at = [0.0] * replicas  # ready at t=0, not started: no standby taken
        self.pool.heap[:] = [0.0] * (replicas * self.pool.slots)
        self.ready = replicas
        self.server_queue = INF if profile.queue_limit is None else float(profile.queue_limit)
        self.timeout: float | None = getattr(policy, "timeout_s", None)
        self.finished = 0
        self.replica_seconds = 0.0
        self.scale_events = 0
        self.time_to_capacity: float | None = None
        self.room = self.waiting_room()
        self.batch_cap = self.batch_cap_for_limit()

    def waiting_room(self) -> float:
        """How many requests may wait: the policy's front queue plus, per ready replica, its own queue and
        what it admits beyond its parallelism."""
        policy, profile = self.policy, self.profile
        front = policy.front_queue
        extra = front if front is not None else 0.0
        own = getattr(policy, "replica_queue", None)
        beyond = max(0, (self.limit or 0) - profile.parallelism) if not self.batched else 0
        per = (self.server_queue if own is None else own) + beyond
        if self.ready <= 0 or per <= 0:
            return extra
        return self.ready * per + extra

    def batch_cap_for_limit(self) -> int:
        # a replica holds at most its admission limit in flight, so one of its workers' batches holds at
        # most limit / parallelism requests (Ray Serve: a replica gets at most max_ongoing_requests, and
        # a @serve.batch batch is formed from those; a queue-proxy breaker likewise)
        if self.limit is None:
            return self.profile.max_batch
        return max(1, min(self.profile.max_batch, int(self.limit) // self.profile.parallelism))

    def step(self, k: int) -> None:
        t0 = k * STEP_S
        t1 = t0 + STEP_S
        requests, heap, batch_factor = self.requests, self.pool.heap, self.profile.batch_factor
        if self.timeout is not None:
            requests.expire(t0, self.timeout)
        # the FIFO first, now that capacity may have changed; then the step's arrivals
        if self.batched:
            requests.start_waiting_batched(heap, t1, self.batch_cap, batch_factor)
        else:
            requests.start_waiting(heap, t0, t1)
        lo = self.step_ends[k - 1] if k else 0
        hi = self.step_ends[k]
        self.seconds.requests += hi - lo
        requests.arrive(lo, hi, heap, t1, self.room, self.batch_cap, batch_factor if self.batched else None)
        view = self.observe(k, t1, arrived=hi)
        self.note_capacity(t1)
        self.apply(self.policy.step(view), t1, view.provisioned)
        self.room = self.waiting_room()
        self.batch_cap = self.batch_cap_for_limit()

    def observe(self, k: int, t1: float, arrived: int) -> View:
        """What the policy sees at ``t1``, the end of step ``k`` (and the second's Sample at a full second)."""
        requests, pool, profile = self.requests, self.pool, self.profile
        completed = requests.finished_in_step[k]
        self.finished += completed
        requests.started_by(t1)
        in_flight = arrived - requests.rejected - self.finished
        queued = requests.queued
        self.ready = pool.ready(t1)
        provisioned = len(pool.ready_at)
        if t1 > self.warmup_s + 1e-9:
            self.replica_seconds += provisioned * STEP_S
        capacity = self.ready * profile.parallelism * (profile.max_batch if self.batched else 1)
        self.seconds.add_step(in_flight, queued, capacity, completed, self.share_cores(t1))
        second = None
        if (k + 1) % STEPS_PER_S == 0:
            sec = (k + 1) // STEPS_PER_S
            latencies = requests.latencies_in_second[sec - 1] if sec - 1 <= requests.last_second else []
            second = self.seconds.close(
                sec, latencies, self.ready, provisioned, self.limit, requests.rejected, self.starts.ready_in(t1)
            )
        return View(
            now=t1, in_flight=in_flight, queued=queued, ready=self.ready, provisioned=provisioned, second=second
        )

    def share_cores(self, t1: float) -> float:
        """On a shared machine (``profile.machine_cores``): the cores' busy share at ``t1``, and the services
        started in the next step stretched by what the busy servers want over what the cores give."""
        cores = self.profile.machine_cores
        if not cores:
            return 0.0
        demand = sum(1 for free in self.pool.heap if free > t1) * self.profile.cpu_share
        self.requests.stretch = max(1.0, demand / cores)
        return min(1.0, demand / cores)

    def note_capacity(self, t1: float) -> None:
        """After the trace's step, the first time the ready replicas can serve 95 % of its new rate."""
        step_at = self.trace.step_at
        if (
            step_at is not None
            and self.time_to_capacity is None
            and t1 >= step_at
            and self.ready * self.profile.replica_rps(self.limit) >= self.trace.step_rate * 0.95
        ):
            self.time_to_capacity = t1 - step_at

    def apply(self, action: Action | None, now: float, provisioned: int) -> None:
        """The policy's action: replicas (within the profile's cap) and the per-replica admission limit."""
        if action is None:
            return
        pool = self.pool
        limit = action.admission_limit if action.admission_limit is not None else self.limit
        replicas = action.replicas if action.replicas is not None else provisioned
        replicas = max(0, min(self.profile.max_replicas, replicas))
        slots = pool.slots_for(limit)
        if replicas != provisioned or slots != pool.slots:
            if replicas != provisioned and now > self.warmup_s + 1e-9:
                self.scale_events += 1
            pool.resize(now, replicas, self.starts, slots)
        self.limit = limit
        self.ready = pool.ready(now)

    def result(self, n_warm: int) -> Result:
        """The requests still waiting are served by what is left; then the totals past the warm-up."""
        self.requests.drain(self.pool.heap, self.timeout)
        n = len(self.requests.arrival)
        latency = np.full(n, np.nan)
        latency[:] = self.requests.latency
        latency = latency[n_warm:]
        rejected = int(np.count_nonzero(np.isnan(latency)))
        served = latency[~np.isnan(latency)] * 1000.0
        over = int(np.count_nonzero(served > self.profile.slo_ms))
        p50, p99 = (float(x) for x in np.percentile(served, (50, 99))) if served.size else (math.nan, math.nan)
        return Result(
            policy=self.policy.name,
            trace=self.trace.name,
            profile=self.profile.name,
            requests=n - n_warm,
            rejected=rejected,
            over_slo=over,
            replica_seconds=self.replica_seconds,
            p50_ms=p50,
            p99_ms=p99,
            time_to_capacity_s=self.time_to_capacity,
            scale_events=self.scale_events,
            timeline=self.seconds.timeline,
        )
