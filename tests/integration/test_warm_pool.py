"""The warm pool with real standby processes: it fills one standby at a time, a fill asked for while one
runs starts nothing more, and a take is refilled."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

from serving.replicas.local import Launcher, stop_replica
from serving.replicas.warm_pool import WarmPool

pytestmark = pytest.mark.slow  # real replica processes (each imports the serving runtime)


def _standbys(pool: WarmPool) -> list[psutil.Process]:
    return [psutil.Process(r.pid) for r in pool._idle]


def test_fills_one_at_a_time_and_refills_after_a_take(tmp_path):
    pool = WarmPool(2, Launcher(tmp_path / "logs", dict(os.environ)))
    try:
        first = threading.Thread(target=pool.fill)
        first.start()
        pool.fill()  # while the first fill runs: returns at once, starts nothing
        first.join(timeout=180)
        assert not first.is_alive() and pool.idle == 2
        a, b = sorted(_standbys(pool), key=lambda p: p.create_time())
        # the second started only once the first answered live (an interpreter with the runtime imported
        # takes seconds here), not together with it
        assert b.create_time() - a.create_time() >= 1.0
        children = [c for c in psutil.Process().children() if "--standby" in c.cmdline()]
        assert len(children) == 2, "no extra standby from the concurrent fill"

        taken = pool.take()
        assert taken is not None and pool.idle == 1
        pool.fill()
        assert pool.idle == 2 and taken.pid not in {p.pid for p in _standbys(pool)}
        stop_replica(taken)
    finally:
        pool.close()
    assert pool.idle == 0
