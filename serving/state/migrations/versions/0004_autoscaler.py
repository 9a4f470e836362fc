"""The autoscaler's shared state: each gateway's load readings, and the leader's recorded policy state.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gateway_load",
        sa.Column("gateway", sa.Text, primary_key=True),
        sa.Column("endpoint", sa.Text, primary_key=True),
        sa.Column("entity", sa.Text, primary_key=True),
        sa.Column("model_uri", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("reading", sa.Text, nullable=False),
    )
    op.create_table(
        "autoscaler_state",
        sa.Column("endpoint", sa.Text, primary_key=True),
        sa.Column("entity", sa.Text, primary_key=True),
        sa.Column("model_uri", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("autoscaler_state")
    op.drop_table("gateway_load")
