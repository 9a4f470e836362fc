"""The canary's memory reading: the replicas of one model version found in /proc by their command line, both as
spawned (arguments separated by NULs) and as forked by a gateway's fork server (one process title)."""

from __future__ import annotations

from pathlib import Path

from flows.replica_memory import replica_rss_mb


def _process(proc: Path, pid: int, cmdline: bytes, rss_kb: int) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(cmdline)
    (proc / str(pid) / "status").write_text(f"Name:\tpython\nVmRSS:\t{rss_kb} kB\n")


def test_spawned_and_forked_replicas_of_the_version_are_summed_and_no_other_process(tmp_path):
    spawned = (
        b"\0".join(
            [b"python", b"-m", b"serving.replica_server", b"--model-uri", b"models:/fraud/3", b"--port", b"5001"]
        )
        + b"\0"
    )
    forked = b"python -m serving.replica_server --model-uri models:/fraud/3 --host 127.0.0.1 --port 5002" + b"\0" * 40
    _process(tmp_path, 11, spawned, 102400)
    _process(tmp_path, 12, forked, 51200)
    _process(
        tmp_path, 13, b"python -m serving.replica_server --model-uri models:/fraud/4 --port 5003\0", 999999
    )  # another version
    _process(
        tmp_path, 14, b"python\0-m\0serving.replica_server.fork_server\0" + b" " * 64 + b"\0", 999999
    )  # the fork server
    (tmp_path / "self").mkdir()
    assert replica_rss_mb("fraud", "3", proc=tmp_path) == 150.0
    assert replica_rss_mb("fraud", "5", proc=tmp_path) is None
