"""The tables of the state store (SQLAlchemy Core). A change here needs a migration in ``migrations/versions``."""

from __future__ import annotations

from sqlalchemy import Column, Float, Index, Integer, MetaData, Table, Text

metadata = MetaData()

# One row per serving endpoint: the whole record as JSON; ``revision`` is bumped by every write, so a
# compare-and-set notices any write since its read, including one that kept ``config_version``.
endpoints = Table(
    "endpoints",
    metadata,
    Column("name", Text, primary_key=True),
    Column("config_version", Integer, nullable=False),
    Column("revision", Integer, nullable=False),
    Column("record", Text, nullable=False),
)

# The replica registry: each replica in a served entity's routing (one row per address), written by the
# gateway that runs it (``owner_pid``) whenever the entity's replicas change; a gateway started on this state
# adopts the live ones whose owner is gone (``serving.endpoints.reconcile``). ``started_at``: seconds since the epoch.
replicas = Table(
    "replicas",
    metadata,
    Column("host", Text, primary_key=True),
    Column("port", Integer, primary_key=True),
    Column("pid", Integer, nullable=False),
    Column("endpoint", Text, nullable=False),
    Column("entity", Text, nullable=False),
    Column("model_uri", Text, nullable=False),
    Column("backend", Text, nullable=False),
    Column("owner_pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Index("replicas_by_entity", "endpoint", "entity"),
)

# Leases: ``leader`` is held by one gateway of several sharing a PostgreSQL store until ``expires_at``
# (seconds since the epoch); it renews it well before then. ``term`` grows by one at every change of holder.
leases = Table(
    "leases",
    metadata,
    Column("name", Text, primary_key=True),
    Column("holder", Text, nullable=False),
    Column("expires_at", Float, nullable=False),
    Column("term", Integer, nullable=False),
)

# Each gateway's latest load readings per served entity (a JSON object of counters and levels, written once a
# second by every gateway that is not the leader), so the leader's autoscaler counts all traffic. ``at``:
# seconds since the epoch, when the reading was taken.
gateway_load = Table(
    "gateway_load",
    metadata,
    Column("gateway", Text, primary_key=True),
    Column("endpoint", Text, primary_key=True),
    Column("entity", Text, primary_key=True),
    Column("model_uri", Text, nullable=False),
    Column("at", Float, nullable=False),
    Column("reading", Text, nullable=False),
)

# The autoscaler's recorded state per served entity (its policy state and recent samples, JSON, times in
# seconds since the epoch), written every few seconds by the leader; a new leader continues from it.
autoscaler_state = Table(
    "autoscaler_state",
    metadata,
    Column("endpoint", Text, primary_key=True),
    Column("entity", Text, primary_key=True),
    Column("model_uri", Text, nullable=False),
    Column("at", Float, nullable=False),
    Column("state", Text, nullable=False),
)
