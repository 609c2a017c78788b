"""Initial schema: conversations, turns, ratings, training runs, checkpoints.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "conversations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("title", sa.String(200), nullable=False, server_default=""),
        sa.Column("user_id", sa.String(100), nullable=False, server_default="local"),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("conversation_id", sa.Integer,
                  sa.ForeignKey("conversations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("index", sa.Integer, nullable=False),
        sa.Column("user_message", sa.Text, nullable=False),
        sa.Column("reply", sa.Text, nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary),
        sa.Column("reply_ids", sa.LargeBinary),
        sa.Column("logprobs", sa.LargeBinary),
        sa.Column("checkpoint_id", sa.String(64)),
        sa.Column("model", sa.String(500), nullable=False, server_default=""),
        sa.Column("gen_params", sa.JSON, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("ttft_ms", sa.Float),
        sa.Column("latency_ms", sa.Float),
        sa.Column("interrupted", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("context_forgotten", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.UniqueConstraint("conversation_id", "index", name="uq_turn_position"),
    )
    op.create_index("ix_turns_conversation_id", "turns", ["conversation_id"])
    op.create_table(
        "ratings",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("turn_id", sa.Integer, sa.ForeignKey("turns.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("score", sa.Integer, nullable=False),
        sa.Column("tags", sa.JSON, nullable=False),
        sa.Column("comment", sa.Text, nullable=False, server_default=""),
        sa.Column("critical", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.CheckConstraint("score BETWEEN 1 AND 5", name="ck_rating_score"),
    )
    op.create_index("ix_ratings_updated_at", "ratings", ["updated_at"])
    op.create_table(
        "training_runs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("started_at", sa.DateTime, nullable=False),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("status", sa.String(20), nullable=False, server_default="running"),
        sa.Column("trigger", sa.String(20), nullable=False, server_default="manual"),
        sa.Column("error", sa.Text),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("samples", sa.Integer, nullable=False, server_default="0"),
        sa.Column("checkpoint_id", sa.String(64)),
        sa.Column("pid", sa.Integer),
        sa.Column("ratings_until", sa.DateTime),
    )
    op.create_index("ix_training_runs_status", "training_runs", ["status"])
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("parent_id", sa.String(64)),
        sa.Column("run_id", sa.Integer),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("metrics", sa.JSON, nullable=False),
        sa.Column("active", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("status", sa.String(20), nullable=False, server_default="promoted"),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_index("ix_training_runs_status", table_name="training_runs")
    op.drop_table("training_runs")
    op.drop_index("ix_ratings_updated_at", table_name="ratings")
    op.drop_table("ratings")
    op.drop_index("ix_turns_conversation_id", table_name="turns")
    op.drop_table("turns")
    op.drop_table("conversations")
