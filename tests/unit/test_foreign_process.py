"""A replica process the gateway did not spawn is looked up in /proc at most every RECHECK_S (the data plane
asks on every request), and its end is seen at the first look after it."""

from __future__ import annotations

import subprocess
import sys

from serving.replicas.local import ForeignProcess


def test_the_end_of_a_foreign_process_is_seen_at_the_first_look_after_the_recheck_interval():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    now = [100.0]
    process = ForeignProcess(child.pid, clock=lambda: now[0])
    try:
        assert process.poll() is None
        child.kill()
        child.wait(timeout=10)  # reaped: gone from /proc
        assert process.poll() is None, "no second look within RECHECK_S"
        now[0] += ForeignProcess.RECHECK_S + 0.001
        assert process.poll() == -1
        now[0] -= 10
        assert process.poll() == -1, "an ended process stays ended"
    finally:
        child.kill()
        child.wait()
