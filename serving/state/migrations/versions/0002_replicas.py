"""The replica table: every replica in an entity's routing, so a gateway restarted after a crash adopts them.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("port", sa.Integer, primary_key=True),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("entity", sa.Text, nullable=False),
        sa.Column("model_uri", sa.Text, nullable=False),
        sa.Column("backend", sa.Text, nullable=False),
        sa.Column("owner_pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.Float, nullable=False),
    )
    op.create_index("replicas_by_entity", "replicas", ["endpoint", "entity"])


def downgrade() -> None:
    op.drop_index("replicas_by_entity", "replicas")
    op.drop_table("replicas")
