"""Devices, groups and rollouts in the state store: what every gateway sharing the store answers devices from.

- A device is registered into one group by an operator and gets a token (shown once, kept as its sha256).
- Each report a device sends (``report``) records its status and when it was seen, then moves its group's
  running rollout on (``serving.edge.rollouts.decide``); the rollout's row changes only if it still is what was
  read (its stage and state), so two gateways taking reports at once open a stage once.
- A group serves one model: its rollouts are versions of it (an abort returns to the version before).
- ``desired`` is the version a device should serve: the group's rollout's version for the devices its opened
  stages took in (every device once it completed), what the group served before for the others and for all
  after an abort.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, and_, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from serving.edge.rollouts import (
    ABORTED,
    COMPLETED,
    RUNNING,
    SUPERSEDED,
    DeviceView,
    RolloutPolicy,
    decide,
    stage_members,
)
from serving.protocol.errors import ApiError, conflict, not_found, unavailable
from serving.state.database import Database
from serving.state.schema import edge_devices, edge_rollout_devices, edge_rollouts


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Rollout:
    id: str
    group: str
    model: str
    version: str
    previous_version: str | None
    policy: RolloutPolicy
    stage: int
    state: str
    reason: str
    created_at: float
    updated_at: float

    @classmethod
    def of(cls, row: Any) -> Rollout:
        policy = json.loads(row.policy)
        return cls(
            row.id, row.group_name, row.model, row.version, row.previous_version,
            RolloutPolicy(**{**policy, "stages": tuple(policy["stages"])}), row.stage, row.state, row.reason,
            row.created_at, row.updated_at,
        )  # fmt: skip

    def desired(self, member: bool) -> str | None:
        if self.state == COMPLETED or (self.state == RUNNING and member):
            return self.version
        return self.previous_version


class Fleet:
    def __init__(self, database: Database) -> None:
        self.database = database

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        try:
            with self.database.engine.begin() as connection:
                yield connection
        except (IntegrityError, ApiError):
            raise
        except DBAPIError:
            raise unavailable(f"the state store {self.database.shown} did not answer; retry later") from None

    # devices

    def register(self, device: str, group: str, now: float) -> str:
        """A new device in ``group``; its token (409 when the id is taken)."""
        token = secrets.token_urlsafe(32)
        try:
            with self._transaction() as db:
                db.execute(
                    insert(edge_devices).values(
                        device=device, group_name=group, token_digest=_digest(token), created_at=now
                    )
                )
        except IntegrityError:
            raise conflict(f"device {device} is registered already") from None
        return token

    def authenticate(self, device: str, token: str) -> str | None:
        """The device's group when ``token`` is its token, else None."""
        with self._transaction() as db:
            row = db.execute(select(edge_devices).where(edge_devices.c.device == device)).first()
        if row is None or not hmac.compare_digest(row.token_digest, _digest(token)):
            return None
        return str(row.group_name)

    def devices(self, group: str | None = None) -> list[dict[str, Any]]:
        query = select(edge_devices).order_by(edge_devices.c.device)
        if group is not None:
            query = query.where(edge_devices.c.group_name == group)
        with self._transaction() as db:
            rows = db.execute(query).all()
        return [
            {
                "device": r.device,
                "group": r.group_name,
                "last_seen": r.last_seen,
                **({"status": json.loads(r.status)} if r.status else {}),
            }
            for r in rows
        ]

    def groups(self) -> list[str]:
        with self._transaction() as db:
            return sorted(db.execute(select(edge_devices.c.group_name).distinct()).scalars())

    def report(self, device: str, status: dict[str, Any], now: float) -> None:
        with self._transaction() as db:
            db.execute(
                update(edge_devices)
                .where(edge_devices.c.device == device)
                .values(last_seen=now, status=json.dumps(status))
            )
            group = db.execute(select(edge_devices.c.group_name).where(edge_devices.c.device == device)).scalar_one()
        self.advance(group, now)

    def take_telemetry(self, device: str, stream: int, seqs: list[int]) -> set[int]:
        """Of ``seqs`` (a batch of the device's records), the ones not taken before; marks them taken."""
        with self._transaction() as db:
            row = db.execute(
                select(edge_devices.c.telemetry_stream, edge_devices.c.telemetry_seq)
                .where(edge_devices.c.device == device)
                .with_for_update()
            ).one()
            last = row.telemetry_seq if row.telemetry_stream == str(stream) else 0
            new = {s for s in seqs if s > last}
            if new:
                db.execute(
                    update(edge_devices)
                    .where(edge_devices.c.device == device)
                    .values(telemetry_stream=str(stream), telemetry_seq=max(new))
                )
        return new

    # rollouts

    def _latest(self, db: Connection, group: str) -> Rollout | None:
        row = db.execute(
            select(edge_rollouts)
            .where(and_(edge_rollouts.c.group_name == group, edge_rollouts.c.state != SUPERSEDED))
            .order_by(edge_rollouts.c.created_at.desc())
            .limit(1)
        ).first()
        return Rollout.of(row) if row is not None else None

    def _members(self, db: Connection, rollout_id: str) -> list[str]:
        rows = db.execute(select(edge_rollout_devices.c.device).where(edge_rollout_devices.c.rollout_id == rollout_id))
        return [r.device for r in rows]

    def _group(self, db: Connection, group: str) -> list[str]:
        rows = db.execute(select(edge_devices.c.device).where(edge_devices.c.group_name == group))
        return [r.device for r in rows]

    def _open(self, db: Connection, rollout: Rollout, stage: int, now: float) -> None:
        taken = self._members(db, rollout.id)
        share = rollout.policy.stages[stage]
        rows = db.execute(
            select(edge_devices.c.device, edge_devices.c.last_seen).where(edge_devices.c.group_name == rollout.group)
        ).all()
        since = now - rollout.policy.offline_after_s
        online = {r.device for r in rows if r.last_seen is not None and r.last_seen > since}
        for device in stage_members(rollout.id, share, [r.device for r in rows], taken, online):
            db.execute(insert(edge_rollout_devices).values(rollout_id=rollout.id, device=device, stage=stage))

    def start(self, group: str, model: str, version: str, policy: RolloutPolicy, now: float) -> Rollout:
        """A new rollout of ``model`` ``version`` to ``group``, its first stage open; a running one is superseded."""
        rollout_id = uuid.uuid4().hex
        with self._transaction() as db:
            if not self._group(db, group):
                raise not_found(f"device group {group} has no devices")
            latest = self._latest(db, group)
            if latest is not None and latest.model != model:
                raise conflict(f"device group {group} serves model {latest.model}: roll {model} out to another group")
            previous = latest.desired(member=False) if latest is not None else None
            if latest is not None and latest.state == RUNNING:
                db.execute(
                    update(edge_rollouts)
                    .where(edge_rollouts.c.id == latest.id)
                    .values(state=SUPERSEDED, updated_at=now)
                )
            values = {
                "id": rollout_id, "group_name": group, "model": model, "version": version,
                "previous_version": previous, "policy": json.dumps(asdict(policy)), "stage": 0, "state": RUNNING,
                "reason": "stage 1 opened", "created_at": now, "updated_at": now,
            }  # fmt: skip
            db.execute(insert(edge_rollouts).values(**values))
            rollout = Rollout.of(db.execute(select(edge_rollouts).where(edge_rollouts.c.id == rollout_id)).one())
            self._open(db, rollout, 0, now)
        return rollout

    def _views(self, db: Connection, devices: list[str]) -> dict[str, DeviceView]:
        if not devices:
            return {}
        out = {}
        for r in db.execute(select(edge_devices).where(edge_devices.c.device.in_(devices))):
            status = json.loads(r.status) if r.status else {}
            rejected = frozenset(str(v) for v in (status.get("rejected") or {}))
            version = status.get("version")
            out[r.device] = DeviceView(r.device, str(version) if version else None, rejected, r.last_seen)
        return out

    def advance(self, group: str, now: float) -> Rollout | None:
        """The group's latest rollout after one decision on it (see ``serving.edge.rollouts.decide``)."""
        with self._transaction() as db:
            rollout = self._latest(db, group)
            if rollout is None or rollout.state != RUNNING:
                return rollout
            decision = decide(
                rollout.policy, rollout.version, rollout.stage, self._views(db, self._members(db, rollout.id)), now
            )
            if decision.action == "wait":
                return rollout
            changes: dict[str, Any] = {"reason": decision.reason, "updated_at": now}
            if decision.action == "abort":
                changes["state"] = ABORTED
            elif decision.action == "complete":
                changes["state"] = COMPLETED
            else:
                changes["stage"] = rollout.stage + 1
            done = db.execute(
                update(edge_rollouts)
                .where(
                    and_(
                        edge_rollouts.c.id == rollout.id,
                        edge_rollouts.c.stage == rollout.stage,
                        edge_rollouts.c.state == RUNNING,
                    )
                )
                .values(**changes)
            )
            if done.rowcount == 1 and decision.action == "advance":
                self._open(
                    db,
                    Rollout.of(db.execute(select(edge_rollouts).where(edge_rollouts.c.id == rollout.id)).one()),
                    rollout.stage + 1,
                    now,
                )
            return Rollout.of(db.execute(select(edge_rollouts).where(edge_rollouts.c.id == rollout.id)).one())

    def abort(self, rollout_id: str, reason: str, now: float) -> Rollout:
        with self._transaction() as db:
            done = db.execute(
                update(edge_rollouts)
                .where(and_(edge_rollouts.c.id == rollout_id, edge_rollouts.c.state == RUNNING))
                .values(state=ABORTED, reason=reason, updated_at=now)
            )
            row = db.execute(select(edge_rollouts).where(edge_rollouts.c.id == rollout_id)).first()
        if row is None:
            raise not_found(f"rollout {rollout_id} does not exist")
        if done.rowcount != 1:
            raise conflict(f"rollout {rollout_id} is {row.state}, not running")
        return Rollout.of(row)

    def rollout(self, rollout_id: str) -> tuple[Rollout, dict[str, int]]:
        """A rollout and its devices' stages (device -> the stage that took it in)."""
        with self._transaction() as db:
            row = db.execute(select(edge_rollouts).where(edge_rollouts.c.id == rollout_id)).first()
            if row is None:
                raise not_found(f"rollout {rollout_id} does not exist")
            stages = db.execute(
                select(edge_rollout_devices).where(edge_rollout_devices.c.rollout_id == rollout_id)
            ).all()
        return Rollout.of(row), {r.device: r.stage for r in stages}

    def bundles_for(self, group: str) -> set[tuple[str, str]]:
        """The (model, version) bundles a device of ``group`` may fetch: its latest rollout's, and what it replaced."""
        with self._transaction() as db:
            rollout = self._latest(db, group)
        if rollout is None:
            return set()
        return {(rollout.model, v) for v in (rollout.version, rollout.previous_version) if v is not None}

    def desired(self, device: str, group: str) -> tuple[str, str] | None:
        """(model, version) the device should serve, or None when its group has had no rollout."""
        with self._transaction() as db:
            rollout = self._latest(db, group)
            if rollout is None:
                return None
            member = rollout.state == RUNNING and device in self._members(db, rollout.id)
        version = rollout.desired(member)
        return (rollout.model, version) if version is not None else None
