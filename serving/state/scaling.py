"""The autoscaler's shared state in the store: what every gateway measured, and what the leader decided.

- ``LoadBoard``: each gateway that is not the leader publishes its latest load reading per served entity
  (``publish`` replaces its rows); the leader reads the others' fresh ones (``others``) once a second and
  adds them to its own samples. Readings are JSON objects the gateway defines; this layer only keeps them.
- ``ScalerRecords``: the leader saves each served entity's policy state and recent samples every few
  seconds (``save``); a gateway that becomes leader, or restarts, continues from them (``load``). They go
  with their endpoint: ``EndpointStore.delete`` removes them, and a save for an endpoint the store no longer
  has is dropped, so an endpoint created again under the name starts afresh.

Neither sends a change notice: they are written every second or so and nobody waits on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, delete, insert, select

from serving.state.database import Database
from serving.state.lease import Fence
from serving.state.schema import autoscaler_state, endpoints, gateway_load

EntityKey = tuple[str, str]  # (endpoint, served entity)


@dataclass(frozen=True)
class Reading:
    gateway: str
    endpoint: str
    entity: str
    model_uri: str
    at: float  # seconds since the epoch
    values: Mapping[str, Any]

    @property
    def key(self) -> EntityKey:
        return self.endpoint, self.entity


class LoadBoard:
    def __init__(self, database: Database) -> None:
        self.database = database

    def publish(self, gateway: str, readings: Iterable[Reading]) -> None:
        """``gateway``'s readings are now exactly these (an entity it no longer serves loses its row)."""
        rows = [
            {
                "gateway": gateway,
                "endpoint": r.endpoint,
                "entity": r.entity,
                "model_uri": r.model_uri,
                "at": r.at,
                "reading": json.dumps(dict(r.values)),
            }
            for r in readings
        ]
        with self.database.engine.begin() as db:
            db.execute(delete(gateway_load).where(gateway_load.c.gateway == gateway))
            if rows:
                db.execute(insert(gateway_load), rows)

    def others(self, gateway: str, since: float) -> list[Reading]:
        """The other gateways' readings taken after ``since`` (older ones are from gateways gone or stuck)."""
        query = select(gateway_load).where(and_(gateway_load.c.gateway != gateway, gateway_load.c.at > since))
        with self.database.engine.connect() as db:
            return [
                Reading(row.gateway, row.endpoint, row.entity, row.model_uri, row.at, json.loads(row.reading))
                for row in db.execute(query)
            ]

    def forget(self, gateway: str) -> None:
        with self.database.engine.begin() as db:
            db.execute(delete(gateway_load).where(gateway_load.c.gateway == gateway))


@dataclass(frozen=True)
class ScalerRecord:
    endpoint: str
    entity: str
    model_uri: str
    at: float  # seconds since the epoch
    state: Mapping[str, Any]

    @property
    def key(self) -> EntityKey:
        return self.endpoint, self.entity


class ScalerRecords:
    """The autoscaler's recorded state, written by the leader (its writes fenced: ``serving.state.lease.Fence``)."""

    def __init__(self, database: Database, fence: Fence | None = None) -> None:
        self.database = database
        self.fence = fence

    def save(self, records: Iterable[ScalerRecord]) -> None:
        """Replace the record of each entity given; the others are left as they are. A record of an endpoint
        the store no longer has is dropped (taken just before its endpoint was deleted, it arrives after)."""
        records = list(records)
        if not records:
            return
        with self.database.engine.begin() as db:
            if self.fence is not None:
                self.fence.check(db)
            stored = set(
                db.execute(
                    select(endpoints.c.name).where(endpoints.c.name.in_({r.endpoint for r in records}))
                ).scalars()
            )
            records = [r for r in records if r.endpoint in stored]
            if not records:
                return
            for r in records:
                db.execute(
                    delete(autoscaler_state).where(
                        and_(autoscaler_state.c.endpoint == r.endpoint, autoscaler_state.c.entity == r.entity)
                    )
                )
            db.execute(
                insert(autoscaler_state),
                [
                    {
                        "endpoint": r.endpoint,
                        "entity": r.entity,
                        "model_uri": r.model_uri,
                        "at": r.at,
                        "state": json.dumps(dict(r.state)),
                    }
                    for r in records
                ],
            )

    def load(self) -> dict[EntityKey, ScalerRecord]:
        with self.database.engine.connect() as db:
            return {
                (row.endpoint, row.entity): ScalerRecord(
                    row.endpoint, row.entity, row.model_uri, row.at, json.loads(row.state)
                )
                for row in db.execute(select(autoscaler_state))
            }

    def forget(self, before: float) -> None:
        """Drop the records last saved before ``before`` (endpoints deleted, entities replaced long ago); the
        others stay, so an entity still being restored keeps its record until it is resumed."""
        with self.database.engine.begin() as db:
            db.execute(delete(autoscaler_state).where(autoscaler_state.c.at < before))
