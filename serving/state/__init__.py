"""Shared state of the serving tier: one database behind SQLAlchemy Core, its schema kept by Alembic.

SQLite in the state folder is the embedded default (one gateway); ``TOLLFREE_STATE_URL`` names a
PostgreSQL database (psycopg 3) that several gateways share.
"""
