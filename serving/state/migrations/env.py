"""Alembic's environment: always run from ``serving.state.migrate`` with an open connection (no alembic.ini)."""

from alembic import context

from serving.state.schema import metadata

connection = context.config.attributes["connection"]
context.configure(
    connection=connection, target_metadata=metadata, render_as_batch=connection.dialect.name == "sqlite"
)  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
