"""A checker of what the serving-endpoints API promises about config updates, run on a recorded history (as
Jepsen's checkers are): each client's requests with when they were sent and answered and what the answer said,
then each endpoint's final read.

The model: an endpoint's config is a register of versions. ``PUT .../config`` either is acknowledged (200) with
the version it will become (``pending_config.config_version``), is refused (409 or another 4xx, and then is never
applied), or has an unknown outcome (a 5xx, a connection cut, a timeout: it may or may not be applied). A write
carries a marker no other write carries, so whatever a read shows names the write it came from. What must hold:

1. one winner per version: no two acknowledged writes of an endpoint were given the same version;
2. acknowledged order: a write acknowledged before another was sent has the lower version;
3. nothing acknowledged is lost: at the end the endpoint is at the highest acknowledged version or past it, and at
   exactly that version it shows that write's marker;
4. nothing refused shows: no read ever shows a marker of a refused write;
5. one meaning per version: every read of one version shows the same marker, that of the write acknowledged
   with it, if one was;
6. reads never go back: a read sent after another was answered shows a version no lower (current or pending);
7. an acknowledged write is seen: a read sent after it was answered shows its version, as current or pending.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

OK, REFUSED, UNKNOWN = "ok", "refused", "unknown"


@dataclass(frozen=True)
class Write:
    client: int
    endpoint: str
    marker: int
    sent: float
    answered: float
    outcome: str  # OK, REFUSED or UNKNOWN
    status: int  # the HTTP status, 0 for no answer
    version: int | None = None  # an acknowledged write's version


@dataclass(frozen=True)
class Read:
    client: int
    endpoint: str
    sent: float
    answered: float
    version: int  # the current config's version
    marker: int | None  # the current config's marker (None: the endpoint's first config, written by no client)
    pending: tuple[int, int | None] | None = None  # the pending config's (version, marker), while one is


def outcome_of(status: int) -> str:
    """200 acknowledged; another 4xx refused (409 a conflict, nothing applied); a 5xx or no answer unknown."""
    if status == 200:
        return OK
    if 400 <= status < 500:
        return REFUSED
    return UNKNOWN


def violations(writes: list[Write], reads: list[Read], final: dict[str, Read]) -> list[str]:
    """Every promise the history breaks, each naming the requests involved; empty when it holds."""
    found: list[str] = []
    for endpoint in sorted({w.endpoint for w in writes} | set(final)):
        found += _endpoint(
            endpoint,
            [w for w in writes if w.endpoint == endpoint],
            [r for r in reads if r.endpoint == endpoint] + ([final[endpoint]] if endpoint in final else []),
            final.get(endpoint),
        )
    return found


def _endpoint(name: str, writes: list[Write], reads: list[Read], final: Read | None) -> list[str]:
    found = []
    acked = sorted((w for w in writes if w.outcome == OK), key=lambda w: w.answered)
    by_version: dict[int, list[Write]] = defaultdict(list)
    for write in acked:
        if write.version is None:
            found.append(f"{name}: {_show(write)} was acknowledged without a version")
        else:
            by_version[write.version].append(write)
    for version, same in sorted(by_version.items()):  # 1
        if len(same) > 1:
            found.append(f"{name}: version {version} acknowledged to {len(same)} writes: {[_show(w) for w in same]}")
    for first in acked:  # 2
        for later in acked:
            if first.answered < later.sent and (first.version or 0) >= (later.version or 0):
                found.append(f"{name}: {_show(later)} was sent after {_show(first)} was acknowledged, not above it")
    if final is not None and acked:  # 3
        last = max(acked, key=lambda w: w.version or 0)
        if final.version < (last.version or 0):
            found.append(f"{name}: {_show(last)} was lost: the endpoint ended at version {final.version}")
        elif final.version == last.version and final.marker != last.marker:
            found.append(f"{name}: {_show(last)} was lost: version {final.version} ended with marker {final.marker}")
    refused = {w.marker: w for w in writes if w.outcome == REFUSED}
    meaning = {w.version: w.marker for w in acked if w.version is not None}
    for read in reads:
        for version, marker in [(read.version, read.marker), *([read.pending] if read.pending else [])]:
            if marker in refused:  # 4
                found.append(f"{name}: {_show(read)} shows the marker of refused {_show(refused[marker])}")
            if version in meaning and marker != meaning[version]:  # 5
                found.append(
                    f"{name}: {_show(read)} shows marker {marker} at version {version}, acknowledged to "
                    f"marker {meaning[version]}"
                )
            meaning.setdefault(version, marker)
    for before in reads:  # 6
        for after in reads:
            if before.answered < after.sent and _highest(after) < _highest(before):
                found.append(f"{name}: {_show(after)} went back from {_show(before)}")
    for write in acked:  # 7
        for read in reads:
            if write.answered < read.sent and _highest(read) < (write.version or 0):
                found.append(f"{name}: {_show(read)} does not see {_show(write)}, acknowledged before it was sent")
    return found


def _highest(read: Read) -> int:
    return max(read.version, read.pending[0] if read.pending else 0)


def _show(op: Write | Read) -> str:
    if isinstance(op, Write):
        return (
            f"write(client {op.client}, marker {op.marker}, {op.sent:.3f}-{op.answered:.3f}, {op.status} "
            f"{op.outcome}, version {op.version})"
        )
    return (
        f"read(client {op.client}, {op.sent:.3f}-{op.answered:.3f}, version {op.version} marker {op.marker}, "
        f"pending {op.pending})"
    )


def render(writes: list[Write], reads: list[Read]) -> str:
    """The history in the order the requests were sent, one per line (printed when a check fails)."""
    ops: list[Write | Read] = sorted([*writes, *reads], key=lambda op: op.sent)
    return "\n".join(f"{op.endpoint}: {_show(op)}" for op in ops)
