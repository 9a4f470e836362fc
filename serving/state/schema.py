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

# The replica table: each replica in a served entity's routing (one row per address), written by the
# gateway that runs it (``owner_pid``) whenever the entity's replicas change; a gateway started on this state
# adopts the live ones whose owner is gone (``serving.replicas.book``). ``replica_id``: the replica's id
# (``serving.traffic.replica``); ``started_at``: seconds since the epoch.
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
    Column("replica_id", Text, nullable=False),
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

# Edge devices (``serving.edge.fleet``): each device's group, its token's sha256, when it was last seen and what
# it reported (JSON: version served, previous, rejected versions, telemetry counters); ``telemetry_stream`` and
# ``telemetry_seq``: the last inference record taken from it, so a retried upload is not logged twice.
edge_devices = Table(
    "edge_devices",
    metadata,
    Column("device", Text, primary_key=True),
    Column("group_name", Text, nullable=False),
    Column("token_digest", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("last_seen", Float),
    Column("status", Text),
    Column("telemetry_stream", Text),
    Column("telemetry_seq", Integer, nullable=False, server_default="0"),
    Index("edge_devices_by_group", "group_name"),
)

# Staged rollouts of a bundle to a group (``serving.edge.rollouts``): ``stage`` is the last stage opened, ``state``
# running, completed, aborted or superseded; ``previous_version`` what the group served before (where an abort
# sends it back); ``policy``: the stages and abort criteria, JSON.
edge_rollouts = Table(
    "edge_rollouts",
    metadata,
    Column("id", Text, primary_key=True),
    Column("group_name", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("version", Text, nullable=False),
    Column("previous_version", Text),
    Column("policy", Text, nullable=False),
    Column("stage", Integer, nullable=False),
    Column("state", Text, nullable=False),
    Column("reason", Text, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    Index("edge_rollouts_by_group", "group_name", "created_at"),
)

# The devices each stage of a rollout took in, chosen when the stage opened.
edge_rollout_devices = Table(
    "edge_rollout_devices",
    metadata,
    Column("rollout_id", Text, primary_key=True),
    Column("device", Text, primary_key=True),
    Column("stage", Integer, nullable=False),
)
