"""Each replica row carries the replica's id (``local:<host>:<port>:<pid>`` for a replica process), the one
identity the gateways, their dispatchers and their autoscalers know a replica by.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("replicas") as table:
        table.add_column(sa.Column("replica_id", sa.Text, nullable=False, server_default=""))
    # the rows there are of replica processes (the only kind the table held): their id from their address and pid
    op.execute(
        "UPDATE replicas SET replica_id = 'local:' || host || ':' || CAST(port AS TEXT) || ':' || CAST(pid AS TEXT)"
    )
    with op.batch_alter_table("replicas") as table:
        table.alter_column("replica_id", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("replicas") as table:
        table.drop_column("replica_id")
