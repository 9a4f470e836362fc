"""The gateway's uvicorn server, which records where it listens in the state folder (``serving.discovery``), so
that flows and the MLflow plugin on the same state folder find a gateway started on any port."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import uvicorn

from serving.discovery import URL_ENV, Found, client_url, remove_record, write_record

log = logging.getLogger(__name__)


class RecordingServer(uvicorn.Server):
    """A uvicorn server that writes its gateway record once its socket is bound (so ``--port 0`` records the
    real port) and removes it first thing on shutdown, before connections drain: a stopping gateway is not
    one for clients to find. A record that cannot be written is logged, not fatal: clients can still be
    given the URL in ``TOLLFREE_GATEWAY_URL``."""

    def __init__(self, config: uvicorn.Config, records: Path) -> None:
        super().__init__(config)
        self._records = records
        self._written: Found | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._record()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._written is not None:
            remove_record(*self._written)
            self._written = None
        await super().shutdown(sockets)

    def _record(self) -> None:
        bound = [s for server in self.servers for s in server.sockets if s.family in (socket.AF_INET, socket.AF_INET6)]
        if not bound:
            return  # a Unix socket or an inherited file descriptor: no URL to record
        host, port = bound[0].getsockname()[:2]
        url = client_url(host, port, "https" if self.config.is_ssl else "http")
        try:
            self._written = write_record(self._records, url)
        except OSError as exc:
            log.warning(
                "could not record the gateway's URL in %s (%s): clients on this state folder need %s=%s",
                self._records,
                exc,
                URL_ENV,
                url,
            )
            return
        log.info("listening at %s, recorded in %s", url, self._written[0])
