"""One autoscaler for several gateways: followers publish their load, the leader adds it and records its state.

Why publish through the state store rather than have the leader scrape each gateway: the gateways already
share the store, a gateway need not know the others' addresses (behind HAProxy or a Kubernetes Service they
are hidden), and it costs one small write per follower and one read by the leader a second, off the event
loop, never per request.

- A follower's reading per served entity (``reading``): its in-flight and queued requests (time-averages
  over its last second), its arrivals and completions as running totals, its latency p50/p99 over the
  second, and the busy clock of each replica (by its id, ``serving.traffic.replica``) from its latest answer.
- ``merged``: the leader adds the fresh readings of every other gateway for the same model to its own
  sample: levels summed, arrivals and completions at the rate the totals rose since the last reading seen
  (so a reading read twice or missed neither doubles nor drops a second's traffic), p99 the highest, p50
  weighted by completions. Readings older than ``FRESH_S`` are from a gateway gone or stuck, and left out.
- ``SharedScaling``: a thread that, once a second, writes this gateway's readings (the leader a heartbeat), reads
  the others' (the leader merges them; every gateway counts who is there, ``gateway_shares``), and saves the
  leader's records (``serving.autoscaler.record``) every few seconds; the records are read at start and while
  following, so a new leader continues from them, and a follower sends each replica at most the per-replica
  limit the leader's record carries (``follow_limits``), scaled by its share.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from serving.autoscaler.signals import Sample
from serving.gateway.gateway_shares import MEMBER_FRESH_S, Shares, members
from serving.state.scaling import EntityKey, LoadBoard, Reading, ScalerRecord, ScalerRecords
from serving.traffic.load_meter import LoadReading

if TYPE_CHECKING:
    from serving.endpoints.live import LiveEndpoint

log = logging.getLogger(__name__)

FRESH_S = 3.0  # a reading older than this is from a gateway gone or stuck
LIMIT = "max_concurrency"  # in a leader's record: the policy's per-replica admission limit
HEARTBEAT = "heartbeat"  # the leader's reading: it is there (``gateway_shares``), its load is its own
KEEP_RECORDS_S = 3600.0  # a record not saved again for this long is of an entity gone (a resume takes them younger)


def reading(load: LoadReading, totals: tuple[int, int], busy: Mapping[str, float]) -> dict[str, Any]:
    """A follower's reading of one entity: ``load`` over its last second, ``totals`` (arrivals, completed)
    since it started, ``busy`` the latest busy clock of each replica by replica id."""
    return {
        "in_flight": load.in_flight,
        "queue_depth": load.queue_depth,
        "arrivals_total": totals[0],
        "completed_total": totals[1],
        "latency_p50_ms": load.latency_p50_ms,
        "latency_p99_ms": load.latency_p99_ms,
        "busy": dict(busy),
    }


def follow_limits(live: Mapping[str, LiveEndpoint], recorded: Mapping[EntityKey, ScalerRecord], shares: Shares) -> None:
    """A follower lets each replica have what the leader lets it have: the policy's per-replica limit, from the
    leader's record of the same model, not the endpoint's default of 32 (scaled by ``shares`` when a gateway that
    shared the replicas has gone). Otherwise a follower's requests fill the replicas' own queues past what the
    leader sized them for, and the leader's requests wait behind them (its queue then sheds them as though the
    replicas were slow)."""
    for endpoint, served in list(live.items()):
        for name, replica_set in served.replica_sets.items():
            found = recorded.get((endpoint, name))
            if not replica_set.followed or found is None or found.model_uri != replica_set.model_uri:
                continue
            limit = found.state.get(LIMIT)
            if isinstance(limit, int) and limit >= 1:
                scaled = shares.limit((endpoint, name), limit)
                if scaled != replica_set.max_concurrency:
                    replica_set.set_limits(max_concurrency=scaled)


class RemoteLoad:
    """The leader's side: the other gateways' readings turned into additions to its own samples."""

    def __init__(self) -> None:
        # per gateway and entity: the last totals seen, when they were taken, and the rates they gave
        self._last: dict[tuple[str, EntityKey], tuple[tuple[int, int], float, tuple[float, float]]] = {}

    def rates(self, r: Reading) -> tuple[float, float]:
        """Arrivals and completions a second at ``r``'s gateway: the rise of its totals since its last reading
        seen, over the time between them (the same rates again for the same reading; none the first time, or
        after its totals went back: a restarted gateway). Rates, not rises: a reading missed makes the next
        rise cover two seconds, which must not count as one second of twice the traffic."""
        totals = (int(r.values.get("arrivals_total", 0)), int(r.values.get("completed_total", 0)))
        key = (r.gateway, r.key)
        last = self._last.get(key)
        if last is not None and r.at == last[1]:
            return last[2]
        rates = (0.0, 0.0)
        if last is not None and r.at > last[1] and totals[0] >= last[0][0] and totals[1] >= last[0][1]:
            seconds = r.at - last[1]
            rates = ((totals[0] - last[0][0]) / seconds, (totals[1] - last[0][1]) / seconds)
        self._last[key] = (totals, r.at, rates)
        return rates

    def merged(self, sample: Sample, model_uri: str, readings: Iterable[Reading], seconds: float = 1.0) -> Sample:
        """``sample`` (over ``seconds``) plus the readings of other gateways for the same entity and model."""
        in_flight, queue = sample.in_flight, sample.queue_depth
        arrivals, completed = float(sample.requests), float(sample.completed)
        p50_weighted = (sample.latency_p50_ms or 0.0) * sample.completed
        p99s = [sample.latency_p99_ms] if sample.latency_p99_ms is not None else []
        for r in readings:
            if r.model_uri != model_uri:
                continue
            arriving, completing = self.rates(r)
            in_flight += float(r.values.get("in_flight", 0.0))
            queue += float(r.values.get("queue_depth", 0.0))
            arrivals += arriving * seconds
            completed += completing * seconds
            if r.values.get("latency_p50_ms") is not None:
                p50_weighted += float(r.values["latency_p50_ms"]) * completing * seconds
            if r.values.get("latency_p99_ms") is not None:
                p99s.append(float(r.values["latency_p99_ms"]))
        p50 = p50_weighted / completed if completed else sample.latency_p50_ms
        return replace(
            sample,
            in_flight=in_flight,
            queue_depth=queue,
            requests=round(arrivals),
            completed=round(completed),
            latency_p50_ms=p50,
            latency_p99_ms=max(p99s) if p99s else None,
        )

    @staticmethod
    def busy_clocks(readings: Iterable[Reading]) -> dict[str, float]:
        """The latest busy clock any other gateway saw, per replica id."""
        out: dict[str, float] = {}
        for r in readings:
            for replica, clock in (r.values.get("busy") or {}).items():
                out[replica] = max(out.get(replica, 0.0), float(clock))
        return out


class SharedScaling:
    """This gateway's side of the autoscaler's shared state, kept by a background thread (see the module)."""

    def __init__(
        self,
        board: LoadBoard,
        records: ScalerRecords,
        me: str,
        leading: Callable[[], bool],
        *,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.board = board
        self.records = records
        self.me = me
        self.leading = leading
        self.interval_s = interval_s
        self.clock = clock
        self.recorded: dict[EntityKey, ScalerRecord] = {}
        self._remote: list[Reading] = []
        self._members: dict[EntityKey, int] = {}
        self._offered: list[Reading] | None = None
        self._to_save: list[ScalerRecord] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the event loop's side: never blocks on the store ---------------------------------------

    def offer(self, readings: list[Reading]) -> None:
        with self._lock:
            self._offered = readings

    def remote(self) -> list[Reading]:
        with self._lock:
            return list(self._remote)

    def members(self) -> dict[EntityKey, int]:
        """Per entity, the other gateways there now (``gateway_shares.members``)."""
        with self._lock:
            return dict(self._members)

    def record(self, records: list[ScalerRecord]) -> None:
        with self._lock:
            self._to_save = records

    # ---- the thread --------------------------------------------------------------------------------

    def load_records(self) -> None:
        try:
            self.recorded = self.records.load()
        except Exception as exc:
            log.warning("autoscaler records not read: %s", type(exc).__name__)

    def tick(self) -> None:
        """One round: publish what was offered, read the others (leader) or the records (follower), save."""
        with self._lock:
            offered, self._offered = self._offered, None
            to_save, self._to_save = self._to_save, None
        if offered is not None:
            self.board.publish(self.me, offered)
        now = self.clock()
        found = self.board.others(self.me, now - FRESH_S)
        with self._lock:
            self._members = members(found, now - MEMBER_FRESH_S)
            self._remote = [r for r in found if HEARTBEAT not in r.values] if self.leading() else []
        if not self.leading():
            self.load_records()
        if to_save is not None:
            self.records.save(to_save)
            self.records.forget(before=self.clock() - KEEP_RECORDS_S)

    def start(self) -> None:
        self.load_records()
        self._thread = threading.Thread(target=self._run, name="shared-scaling", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception as exc:
                log.warning("autoscaler's shared state not exchanged: %s", type(exc).__name__)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        try:
            self.board.forget(self.me)
        except Exception as exc:
            log.warning("load readings not removed: %s", type(exc).__name__)
