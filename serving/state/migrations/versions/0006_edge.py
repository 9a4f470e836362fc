"""Edge serving: devices, staged rollouts of a bundle to a device group, and each stage's devices.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "edge_devices",
        sa.Column("device", sa.Text, primary_key=True),
        sa.Column("group_name", sa.Text, nullable=False),
        sa.Column("token_digest", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("last_seen", sa.Float),
        sa.Column("status", sa.Text),
        sa.Column("telemetry_stream", sa.Text),
        sa.Column("telemetry_seq", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("edge_devices_by_group", "edge_devices", ["group_name"])
    op.create_table(
        "edge_rollouts",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("group_name", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("version", sa.Text, nullable=False),
        sa.Column("previous_version", sa.Text),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("stage", sa.Integer, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_index("edge_rollouts_by_group", "edge_rollouts", ["group_name", "created_at"])
    op.create_table(
        "edge_rollout_devices",
        sa.Column("rollout_id", sa.Text, primary_key=True),
        sa.Column("device", sa.Text, primary_key=True),
        sa.Column("stage", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("edge_rollout_devices")
    op.drop_index("edge_rollouts_by_group", "edge_rollouts")
    op.drop_table("edge_rollouts")
    op.drop_index("edge_devices_by_group", "edge_devices")
    op.drop_table("edge_devices")
