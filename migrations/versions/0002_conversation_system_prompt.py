"""A conversation's own system prompt (nullable: older conversations had none).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-28
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("conversations", sa.Column("system_prompt", sa.Text, nullable=True))


def downgrade() -> None:
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+), not batch mode: batch mode copies
    # the table and drops the old one, and with foreign keys on, SQLite's DROP TABLE
    # deletes its rows first, which would cascade to every turn.
    op.drop_column("conversations", "system_prompt")
