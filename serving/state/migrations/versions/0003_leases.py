"""Leases: the leader of several gateways on one PostgreSQL store holds the ``leader`` row until it expires.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("holder", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("term", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("leases")
