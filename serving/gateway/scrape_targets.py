"""Prometheus's scrape targets, kept current by each gateway for file-based service discovery (``file_sd_configs``).

Each gateway writes two files in ``$TOLLFREE_HOME/prometheus/targets/``, named for it as its record in
``serving.discovery`` is (``<host>-<pid>``):

- ``<name>.gateway.json``: the gateway itself, at the address its control plane listens on (the URL of its
  discovery record), to be scraped with the admin token (``GET /metrics`` is an admin read);
- ``<name>.replicas.json``: the replica processes it runs, each labelled with its endpoint, served entity and
  model version, to be scraped with the replicas' token (``$TOLLFREE_HOME/replica.token``).

A follower of several gateways lists no replica (the leader runs them, and lists them), nor does a gateway whose
replicas are pods: a cluster's own Prometheus discovers those. Each file is a list of target groups in the format
of Prometheus's file discovery, rewritten atomically when what it lists changes (checked every second) and
removed at a clean stop; a gateway that starts removes the files of the gateways of its host that are gone.
Prometheus re-reads the files by itself. ``infra.prometheus`` writes the configuration that reads them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from serving.discovery import GatewayRecord, pid_alive, read_records, record_name
from serving.endpoints.live import LiveEndpoint
from serving.replicas.local import LocalReplica

log = logging.getLogger(__name__)

GATEWAY, REPLICAS = "gateway", "replicas"  # the two kinds of file, the suffix before .json
CHECK_S = 1.0


def gateway_groups(record: GatewayRecord) -> list[dict[str, Any]]:
    """The gateway's own target group: the host and port of its control plane."""
    address = urlsplit(record.url).netloc
    return [{"targets": [address], "labels": {"gateway": record_name(record.hostname, record.pid)}}]


def replica_groups(live: Mapping[str, LiveEndpoint], gateway: str) -> list[dict[str, Any]]:
    """One target group per served entity this gateway runs replica processes for (followed sets and pods
    excluded), its targets sorted, so that an unchanged set writes the same text."""
    groups = []
    for endpoint in sorted(live):
        for entity, replica_set in sorted(live[endpoint].replica_sets.items()):
            if replica_set.followed:
                continue
            targets = sorted(
                f"{r.host}:{r.port}" for r in replica_set.replicas if isinstance(r, LocalReplica) and r.alive()
            )
            if targets:
                labels = {
                    "endpoint": endpoint,
                    "served_entity": entity,
                    "model_version": str(replica_set.version),
                    "gateway": gateway,
                }
                groups.append({"targets": targets, "labels": labels})
    return groups


class ScrapeTargets:
    """The two files of one gateway (see the module's doc), kept by :meth:`run` until it is cancelled."""

    def __init__(
        self,
        folder: Path,
        records: Path,
        live: Callable[[], Mapping[str, LiveEndpoint]],
        *,
        pid: int | None = None,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.folder = folder
        self._records = records
        self._live = live
        self._pid = pid or os.getpid()
        self._alive = alive
        self._written: dict[str, str] = {}  # kind -> the text last written

    async def run(self, interval_s: float = CHECK_S) -> None:
        try:
            self._remove_gone()
            while True:
                try:
                    self.refresh()
                except OSError as exc:  # a full or read-only disk: Prometheus keeps the last list, serving goes on
                    log.warning("could not write the scrape targets in %s: %s", self.folder, exc)
                await asyncio.sleep(interval_s)
        finally:
            self.remove()

    def refresh(self) -> None:
        """Write each file whose content changed; nothing before this gateway has recorded its URL."""
        record = self._own_record()
        if record is None:
            return
        name = record_name(record.hostname, record.pid)
        self._write(name, GATEWAY, gateway_groups(record))
        self._write(name, REPLICAS, replica_groups(self._live(), name))

    def remove(self) -> None:
        for path in self.folder.glob(f"*-{self._pid}.*.json"):
            path.unlink(missing_ok=True)
        self._written.clear()

    def _own_record(self) -> GatewayRecord | None:
        mine = [record for _, record in read_records(self._records) if record.pid == self._pid]
        return mine[0] if mine else None

    def _remove_gone(self) -> None:
        """The files of this host's gateways whose pid no longer runs (killed without a clean stop)."""
        host = record_name(socket.gethostname(), 0).removesuffix("-0")
        for path in self.folder.glob(f"{host}-*.json"):
            owner = path.name.removesuffix(f".{GATEWAY}.json").removesuffix(f".{REPLICAS}.json")
            pid = owner.removeprefix(f"{host}-")
            if pid.isdigit() and int(pid) != self._pid and not self._alive(int(pid)):
                path.unlink(missing_ok=True)

    def _write(self, name: str, kind: str, groups: list[dict[str, Any]]) -> None:
        text = json.dumps(groups, indent=1, sort_keys=True) + "\n"
        if self._written.get(kind) == text:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{name}.", suffix=".tmp")  # not *.json: never read
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.folder / f"{name}.{kind}.json")
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._written[kind] = text
