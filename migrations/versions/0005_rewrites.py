"""Rewrites: the reply a person wrote for a turn, the one they would have wanted.

One per turn (writing again replaces it), gone with its turn (ON DELETE CASCADE, so
``reinf forget`` takes it too). The trainer reads it as a pick of the rewrite over the turn's
reply and as a demonstration (docs/training.md, "Rewrites"). A new table only: no existing
row changes, so this needs no rebuild on SQLite.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rewrites",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("turn_id", sa.Integer, sa.ForeignKey("turns.id", ondelete="CASCADE"),
                  nullable=False, unique=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sqlite_autoincrement=True)


def downgrade() -> None:
    op.drop_table("rewrites")
