"""The tables of the state store (SQLAlchemy Core). A change here needs a migration in ``migrations/versions``."""

from __future__ import annotations

from sqlalchemy import Column, Integer, MetaData, Table, Text

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
