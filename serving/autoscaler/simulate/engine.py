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
capacity).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Protocol

import numpy as np

from serving.autoscaler.signals import Sample
from serving.autoscaler.simulate.profiles import ModelProfile
from serving.autoscaler.simulate.starts import Starts
from serving.autoscaler.simulate.traces import Trace

STEP_S = 0.1
STEPS_PER_S = 10
TAIL_S = 30.0          # simulated after the last arrival
INF = float("inf")


@dataclass(frozen=True)
class View:
    """What a policy observes at a step boundary."""

    now: float
    in_flight: int
    queued: int
    ready: int
    provisioned: int
    second: Optional[Sample]          # set at full seconds


@dataclass(frozen=True)
class Action:
    replicas: Optional[int] = None            # None: unchanged
    admission_limit: Optional[int] = None     # per-replica limit; None: unchanged


class SimPolicy(Protocol):
    name: str
    warm_pool: float                   # standbys (0: cold starts; math.inf: always warm), see starts.py
    front_queue: Optional[float]       # extra waiting room besides the replicas'; INF: unbounded
    replica_queue: Optional[float]     # per ready replica; None: the model server's own (profile.queue_limit)
    timeout_s: Optional[float]         # a request waiting this long is answered with a timeout; None: never

    def initial(self, load: float) -> tuple[int, Optional[int]]:
        """Replicas ready at t=0 for an initial in-flight ``load``, and the per-replica admission limit."""
        ...

    def step(self, view: View) -> Optional[Action]:
        ...


@dataclass
class Result:
    policy: str
    trace: str
    profile: str
    requests: int
    rejected: int
    over_slo: int
    replica_seconds: float
    p50_ms: float
    p99_ms: float
    time_to_capacity_s: Optional[float]
    scale_events: int
    timeline: dict = field(default_factory=dict, repr=False)   # per second: t, rps, replicas, ready, p99_ms, target

    @property
    def over_slo_share(self) -> float:
        return self.over_slo / self.requests if self.requests else 0.0

    @property
    def bad(self) -> int:
        """Requests that were rejected or answered over the SLO."""
        return self.over_slo + self.rejected

    def summary(self) -> dict:
        return {"requests": self.requests, "replica_seconds": round(self.replica_seconds, 1),
                "over_slo_share": round(self.over_slo_share, 6), "over_slo": self.over_slo,
                "rejected": self.rejected, "p50_ms": round(self.p50_ms, 2), "p99_ms": round(self.p99_ms, 2),
                "time_to_capacity_s": None if self.time_to_capacity_s is None else round(self.time_to_capacity_s, 1),
                "scale_events": self.scale_events}


def service_times(trace: Trace, profile: ModelProfile, seed: int) -> np.ndarray:
    """Seconds per request: the trace's ``service_ms`` if it has one, else lognormal from the profile."""
    if trace.service_ms is not None:
        return trace.service_ms / 1000.0
    rng = np.random.default_rng(seed)
    return rng.lognormal(math.log(profile.service_ms / 1000.0), profile.service_sigma, len(trace.arrivals))


class _Pool:
    """Replicas (their ready times) and the heap of server free times."""

    def __init__(self, profile: ModelProfile) -> None:
        self.profile = profile
        self.ready_at: list[float] = []
        self.slots = profile.parallelism
        self.heap: list[float] = []

    def slots_for(self, limit: Optional[int]) -> int:
        p = self.profile
        if p.max_batch > 1 or limit is None:
            return p.parallelism
        return max(1, min(p.parallelism, limit))

    def ready(self, now: float) -> int:
        return bisect.bisect_right(self.ready_at, now + 1e-12)  # ready_at stays sorted

    def resize(self, now: float, replicas: int, starts: Starts, slots: int) -> None:
        heap = self.heap
        if slots != self.slots:
            diff = slots - self.slots
            if diff > 0:
                for r in self.ready_at:
                    heap.extend([max(now, r)] * diff)
            else:
                heap.sort()
                # drop, per replica, |diff| servers: the earliest free (idle first) ones
                drop = -diff * len(self.ready_at)
                del heap[:drop]
            heapq.heapify(heap)
            self.slots = slots
        n = len(self.ready_at)
        if replicas > n:
            for t in starts.ready_times(now, replicas - n):
                self.ready_at.append(t)
                for _ in range(self.slots):
                    heapq.heappush(heap, t)
            self.ready_at.sort()   # a warm start asked for now can be ready before a cold one asked earlier
        elif replicas < n:
            remove = n - replicas
            starting = [r for r in self.ready_at if r > now]
            cancel = min(remove, len(starting))
            if cancel:
                gone = starting[-cancel:]
                del self.ready_at[n - cancel:]
                counts: dict[float, int] = {}
                for r in gone:
                    counts[r] = counts.get(r, 0) + self.slots
                kept = []
                for f in heap:
                    c = counts.get(f, 0)
                    if c:
                        counts[f] = c - 1
                    else:
                        kept.append(f)
                heap[:] = kept
            rest = remove - cancel
            if rest:
                # the oldest ready replicas go; their servers are the earliest free ones (a busy one
                # finishes the request it holds: drain)
                del self.ready_at[:rest]
                heap.sort()
                del heap[:rest * self.slots]
            heapq.heapify(heap)


def with_warmup(trace: Trace, warmup_s: float, seed: int) -> Trace:
    """The trace preceded by ``warmup_s`` of Poisson arrivals at its first 10 s's rate."""
    rng = np.random.default_rng(seed + 7919)
    rate = np.count_nonzero(trace.arrivals < 10.0) / 10.0
    pre = np.sort(rng.uniform(0.0, warmup_s, rng.poisson(rate * warmup_s)))
    svc = None
    if trace.service_ms is not None:
        svc = np.concatenate([rng.choice(trace.service_ms, pre.size), trace.service_ms])
    return Trace(name=trace.name, arrivals=np.concatenate([pre, trace.arrivals + warmup_s]), service_ms=svc,
                 step_at=None if trace.step_at is None else trace.step_at + warmup_s,
                 step_rate=trace.step_rate, note=trace.note)


def simulate(trace: Trace, profile: ModelProfile, policy: SimPolicy, seed: int = 0,
             timeline: bool = True, warmup_s: float = 0.0) -> Result:
    """Run one policy over one trace; deterministic for ``seed``.

    With ``warmup_s``, the trace is preceded by that long at its initial rate (every policy settles,
    tollfree's vertical axis learns), and nothing of the warm-up is counted or drawn.
    """
    full = with_warmup(trace, warmup_s, seed) if warmup_s > 0 else trace
    n_warm = len(full.arrivals) - len(trace.arrivals)
    result = _simulate(full, profile, policy, seed, timeline, n_warm, warmup_s)
    result.trace = trace.name
    return result


def _simulate(trace: Trace, profile: ModelProfile, policy: SimPolicy, seed: int, timeline: bool,
              n_warm: int, warmup_s: float) -> Result:
    arr = trace.arrivals
    n = len(arr)
    svc = service_times(trace, profile, seed)
    batch = profile.max_batch > 1
    bmax = profile.max_batch
    marg = profile.batch_marginal
    end_t = float(arr[-1]) + TAIL_S
    n_steps = int(math.ceil(end_t * STEPS_PER_S)) + 1
    bounds = np.searchsorted(arr, np.arange(1, n_steps + 1) * STEP_S, side="left").tolist()
    arr_l = arr.tolist()
    svc_l = svc.tolist()
    latency = np.full(n, np.nan)
    lat_l = [math.nan] * n
    fin_bucket = [0] * (n_steps + 2)
    fb_last = n_steps + 1     # completions after the end all land in the last bucket
    lat_sec: list[list[float]] = [[] for _ in range(int(end_t) + 3)]
    max_sec = len(lat_sec) - 1

    pool = _Pool(profile)
    starts = Starts(profile, policy.warm_pool)
    first = arr[: max(1, int(np.searchsorted(arr, 10.0)))]
    load0 = len(first) / max(10.0, 1e-9) * profile.mean_service_s
    rep0, limit = policy.initial(load0)
    pool.resize(0.0, 0, starts, pool.slots_for(limit))
    pool.ready_at = [0.0] * rep0     # ready at t=0, not started: no standby taken
    pool.heap[:] = [0.0] * (rep0 * pool.slots)
    heap = pool.heap
    server_queue = INF if profile.queue_limit is None else float(profile.queue_limit)
    timeout = getattr(policy, "timeout_s", None)

    deferred: deque[int] = deque()
    qstarts: deque[float] = deque()
    rejected = 0
    arrived = 0
    finished = 0
    replica_seconds = 0.0
    scale_events = 0
    # per-second accumulators
    acc_inflight = 0.0
    acc_queued = 0.0
    acc_util = 0.0
    sec_requests = 0
    sec_done = 0
    tl_t: list[float] = []
    tl_rps: list[int] = []
    tl_rep: list[int] = []
    tl_ready: list[int] = []
    tl_p99: list[float] = []
    tl_limit: list[float] = []
    tl_bad: list[int] = []
    rej_mark = 0
    slo_s = profile.slo_ms / 1000.0
    cap_time: Optional[float] = None
    step_at = trace.step_at
    need_rps = trace.step_rate
    heappush, heappop, heapreplace = heapq.heappush, heapq.heappop, heapq.heapreplace
    ready_n = rep0

    def room() -> float:
        front = policy.front_queue
        extra = front if front is not None else 0.0
        own = getattr(policy, "replica_queue", None)
        per = (server_queue if own is None else own) + (max(0, (limit or 0) - profile.parallelism) if not batch else 0)
        if ready_n <= 0 or per <= 0:
            return extra
        return ready_n * per + extra

    def batch_cap() -> int:
        # a replica holds at most its admission limit in flight, so one of its workers' batches holds at
        # most limit / parallelism requests (Ray Serve: a replica gets at most max_ongoing_requests, and
        # a @serve.batch batch is formed from those; a queue-proxy breaker likewise)
        if limit is None:
            return bmax
        return max(1, min(bmax, int(limit) // profile.parallelism))

    cur_room = room()
    bcap = batch_cap()
    for k in range(n_steps):
        t0 = k * STEP_S
        t1 = t0 + STEP_S
        if timeout is not None:
            # the oldest waiting requests whose timeout has passed get their timeout answer
            while deferred and arr_l[deferred[0]] + timeout <= t0:
                deferred.popleft()
                rejected += 1
        # -- deferred requests first (FIFO), now that capacity may have changed
        if batch:
            while deferred and heap and heap[0] < t1:
                f = heappop(heap)
                m = min(bcap, len(deferred))
                idx = [deferred.popleft() for _ in range(m)]
                done = f + svc_l[idx[0]] * (1.0 + marg * (m - 1))
                heappush(heap, done)
                for i in idx:
                    lat_l[i] = done - arr_l[i]
                fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += m
                ls = lat_sec[min(int(done), max_sec)]
                for i in idx:
                    ls.append(lat_l[i])
        else:
            while deferred and heap and heap[0] < t1:
                i = deferred.popleft()
                a = arr_l[i]
                f = heap[0]
                s = f if f > a else a
                done = s + svc_l[i]
                heapreplace(heap, done)
                lat_l[i] = done - a
                fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += 1
                lat_sec[min(int(done), max_sec)].append(done - a)
                if s > t0:
                    qstarts.append(s)
        # -- arrivals in [t0, t1)
        hi = bounds[k]
        lo = bounds[k - 1] if k else 0
        sec_requests += hi - lo
        if batch:
            pend_f = -1.0
            pend: list[int] = []
            for i in range(lo, hi):
                a = arr_l[i]
                while qstarts and qstarts[0] <= a:
                    qstarts.popleft()
                if pend and a <= pend_f and len(pend) < bcap:
                    pend.append(i)
                    qstarts.append(pend_f)
                    continue
                if pend:
                    m = len(pend)
                    done = pend_f + svc_l[pend[0]] * (1.0 + marg * (m - 1))
                    heappush(heap, done)
                    fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += m
                    ls = lat_sec[min(int(done), max_sec)]
                    for j in pend:
                        lat_l[j] = done - arr_l[j]
                        ls.append(done - arr_l[j])
                    pend = []
                if deferred or not heap:
                    if len(deferred) + len(qstarts) >= cur_room:
                        rejected += 1
                    else:
                        deferred.append(i)
                    continue
                f = heap[0]
                if f <= a:
                    done = a + svc_l[i]
                    heapreplace(heap, done)
                    lat_l[i] = done - a
                    fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += 1
                    lat_sec[min(int(done), max_sec)].append(done - a)
                elif len(deferred) + len(qstarts) >= cur_room:
                    rejected += 1
                elif f < t1:
                    heappop(heap)
                    pend_f = f
                    pend = [i]
                    qstarts.append(f)
                else:
                    deferred.append(i)
            if pend:
                m = len(pend)
                done = pend_f + svc_l[pend[0]] * (1.0 + marg * (m - 1))
                heappush(heap, done)
                fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += m
                ls = lat_sec[min(int(done), max_sec)]
                for j in pend:
                    lat_l[j] = done - arr_l[j]
                    ls.append(done - arr_l[j])
        else:
            for i in range(lo, hi):
                a = arr_l[i]
                while qstarts and qstarts[0] <= a:
                    qstarts.popleft()
                if deferred or not heap:
                    if len(deferred) + len(qstarts) >= cur_room:
                        rejected += 1
                    else:
                        deferred.append(i)
                    continue
                f = heap[0]
                if f <= a:
                    done = a + svc_l[i]
                elif len(deferred) + len(qstarts) >= cur_room:
                    rejected += 1
                    continue
                elif f < t1:
                    done = f + svc_l[i]
                    qstarts.append(f)
                else:
                    deferred.append(i)
                    continue
                heapreplace(heap, done)
                lat_l[i] = done - a
                fin_bucket[min(int(done * STEPS_PER_S), fb_last)] += 1
                lat_sec[min(int(done), max_sec)].append(done - a)
        # -- observe at t1
        arrived = hi
        finished += fin_bucket[k]
        sec_done += fin_bucket[k]
        while qstarts and qstarts[0] <= t1:
            qstarts.popleft()
        in_flight = arrived - rejected - finished
        queued = len(deferred) + len(qstarts)
        ready_n = pool.ready(t1)
        provisioned = len(pool.ready_at)
        if t1 > warmup_s + 1e-9:
            replica_seconds += provisioned * STEP_S
        busy = in_flight - queued
        cap = ready_n * profile.parallelism * (bmax if batch else 1)
        acc_inflight += in_flight
        acc_queued += queued
        acc_util += (busy / cap) if cap else (1.0 if in_flight else 0.0)
        second = None
        if (k + 1) % STEPS_PER_S == 0:
            sec = (k + 1) // STEPS_PER_S
            lats = lat_sec[sec - 1] if sec - 1 <= max_sec else []
            p50 = p99 = None
            if lats:
                la = np.asarray(lats) * 1000.0
                p50, p99 = (float(x) for x in np.percentile(la, (50, 99)))
            second = Sample(t=float(sec), in_flight=acc_inflight / STEPS_PER_S, ready_replicas=ready_n,
                            replicas=provisioned, queue_depth=acc_queued / STEPS_PER_S, requests=sec_requests, completed=sec_done,
                            latency_p50_ms=p50, latency_p99_ms=p99,
                            utilisation=min(1.0, acc_util / STEPS_PER_S))
            if timeline and sec > warmup_s + 1e-9:
                tl_t.append(float(sec) - warmup_s); tl_rps.append(sec_requests); tl_rep.append(provisioned)
                tl_ready.append(ready_n); tl_p99.append(math.nan if p99 is None else p99)
                tl_limit.append(math.nan if limit is None else float(limit))
                tl_bad.append(sum(1 for x in lats if x > slo_s) + rejected - rej_mark)
            if timeline:
                rej_mark = rejected
            acc_inflight = acc_queued = acc_util = 0.0
            sec_requests = sec_done = 0
        if step_at is not None and cap_time is None and t1 >= step_at:
            if ready_n * profile.replica_rps(limit) >= need_rps * 0.95:
                cap_time = t1 - step_at
        action = policy.step(View(now=t1, in_flight=in_flight, queued=queued, ready=ready_n,
                                  provisioned=provisioned, second=second))
        if action is not None:
            new_limit = action.admission_limit if action.admission_limit is not None else limit
            new_rep = action.replicas if action.replicas is not None else provisioned
            new_rep = max(0, min(profile.max_replicas, new_rep))
            slots = pool.slots_for(new_limit)
            if new_rep != provisioned or slots != pool.slots:
                if new_rep != provisioned and t1 > warmup_s + 1e-9:
                    scale_events += 1
                pool.resize(t1, new_rep, starts, slots)
                heap = pool.heap
            limit = new_limit
            ready_n = pool.ready(t1)
        cur_room = room()
        bcap = batch_cap()
    # requests still waiting at the end: served by what is left, in order (no more arrivals)
    while deferred and heap:
        i = deferred.popleft()
        f = heap[0]
        s = max(f, arr_l[i])
        if timeout is not None and s - arr_l[i] >= timeout:
            continue
        done = s + svc_l[i]
        heapreplace(heap, done)
        lat_l[i] = done - arr_l[i]
    latency[:] = lat_l
    latency = latency[n_warm:]
    rejected = int(np.count_nonzero(np.isnan(latency)))
    served = latency[~np.isnan(latency)] * 1000.0
    over = int(np.count_nonzero(served > profile.slo_ms))
    p50, p99 = (float(x) for x in np.percentile(served, (50, 99))) if served.size else (math.nan, math.nan)
    tl = {}
    if timeline:
        tl = {"t": tl_t, "rps": tl_rps, "replicas": tl_rep, "ready": tl_ready, "p99_ms": tl_p99, "limit": tl_limit,
              "bad": tl_bad}
    return Result(policy=policy.name, trace=trace.name, profile=profile.name, requests=n - n_warm, rejected=rejected,
                  over_slo=over, replica_seconds=replica_seconds, p50_ms=p50, p99_ms=p99,
                  time_to_capacity_s=cap_time, scale_events=scale_events, timeline=tl)
