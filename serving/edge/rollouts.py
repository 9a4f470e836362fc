"""A staged rollout of one bundle to a device group: pure decisions, the clock passed in.

A rollout moves through ``stages``, each a share of the group's devices (``(0.1, 0.5, 1.0)``: a tenth, then
half, then all). A stage's devices are chosen when it opens, on top of the earlier stages', online ones first
(``stage_members``);
devices that join the group later are taken in by the next stage to open, or at once once the rollout is
complete. A device's outcome is read from its reports: ``succeeded`` once it serves the version, ``failed``
once it reports the version rejected (refused, failed its smoke test, rolled back), else ``pending``.

``decide`` (as AWS IoT Greengrass' job configuration does, with its abort criteria) aborts as soon as at least
``min_devices`` devices finished and the failed share of them reaches ``failure_share``; otherwise it opens the
next stage once every device of the opened stages that is online (seen within ``offline_after_s``) has
succeeded, and completes after the last. A device offline holds nothing up: it takes the version when it
comes back. An aborted rollout sends every device back to the version the group had before it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

RUNNING, COMPLETED, ABORTED, SUPERSEDED = "running", "completed", "aborted", "superseded"
SUCCEEDED, FAILED, PENDING = "succeeded", "failed", "pending"


class RolloutConfigError(ValueError):
    """A rollout's settings are invalid; the message names the field."""


@dataclass(frozen=True)
class RolloutPolicy:
    stages: tuple[float, ...] = (0.1, 0.5, 1.0)
    failure_share: float = 0.2  # abort at this share of failed devices among those that finished
    min_devices: int = 1  # ... once at least this many finished
    offline_after_s: float = 60.0  # a device not seen for this long does not hold a stage up

    def __post_init__(self) -> None:
        stages = self.stages
        if not stages or any(not 0 < s <= 1 for s in stages) or list(stages) != sorted(set(stages)):
            raise RolloutConfigError("stages: increasing shares in (0, 1]")
        if stages[-1] != 1:
            raise RolloutConfigError("stages: the last stage must be 1 (every device)")
        if not 0 < self.failure_share <= 1:
            raise RolloutConfigError("abort.failure_share: must be in (0, 1]")
        if self.min_devices < 1:
            raise RolloutConfigError("abort.min_devices: must be at least 1")
        if self.offline_after_s <= 0:
            raise RolloutConfigError("offline_after_s: must be positive")


@dataclass(frozen=True)
class DeviceView:
    """What home knows of one device, as the rollout reads it."""

    device: str
    version: str | None
    rejected: frozenset[str]
    last_seen: float | None

    def outcome(self, version: str) -> str:
        if self.version == version:
            return SUCCEEDED
        if version in self.rejected:
            return FAILED
        return PENDING


@dataclass(frozen=True)
class Decision:
    action: str  # "wait", "advance", "complete" or "abort"
    reason: str


def _order(rollout_id: str, device: str) -> str:
    return hashlib.sha256(f"{rollout_id}/{device}".encode()).hexdigest()


def stage_members(
    rollout_id: str, share: float, group: Sequence[str], already: Sequence[str], online: Collection[str] = ()
) -> list[str]:
    """The devices a stage of ``share`` adds to ``already``: ``ceil(share x group size)`` in all, the others
    taken online devices first (a stage of offline devices only would show nothing), each kind in an order fixed
    by the rollout (a hash of its id and the device's), so two gateways agree."""
    want = math.ceil(share * len(group))
    chosen = set(already)
    rest = sorted((d for d in group if d not in chosen), key=lambda d: (d not in online, _order(rollout_id, d)))
    return rest[: max(0, want - len(chosen))]


def decide(policy: RolloutPolicy, version: str, stage: int, members: Mapping[str, DeviceView], now: float) -> Decision:
    """What the rollout does next; ``stage``: the index of the last opened stage, ``members``: its devices so far."""
    outcomes = {d: view.outcome(version) for d, view in members.items()}
    failed = sum(1 for o in outcomes.values() if o == FAILED)
    finished = failed + sum(1 for o in outcomes.values() if o == SUCCEEDED)
    if finished >= policy.min_devices and failed / finished >= policy.failure_share:
        return Decision("abort", f"{failed} of {finished} devices failed (abort at {policy.failure_share:.0%})")
    online = [
        d for d, view in members.items() if view.last_seen is not None and now - view.last_seen < policy.offline_after_s
    ]
    waiting = [d for d in online if outcomes[d] != SUCCEEDED]
    if waiting or not any(outcomes[d] == SUCCEEDED for d in members):
        return Decision("wait", f"{len(waiting)} online device(s) of stage {stage + 1} not on {version} yet")
    if stage + 1 >= len(policy.stages):
        return Decision("complete", f"every online device serves {version}")
    return Decision("advance", f"stage {stage + 1} done: {len(online)} online device(s) serve {version}")
