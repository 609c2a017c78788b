"""Pairwise preferences (``pairs``), alternative replies in one slot (``turns.picked``), and
turn and rating ids that are never given twice (SQLite AUTOINCREMENT).

Alternatives: turns that share a conversation and an ``index`` are replies to the same
message; the ``picked`` one is on the conversation's path. The unique (conversation,
index) constraint becomes a unique index over the picked turns only. Every existing turn
is picked (there were no alternatives before).

AUTOINCREMENT: SQLite gives the largest rowid + 1 to a new row, so after the newest turn is
forgotten its id comes back for the next one, and a client's ``chatcmpl-<id>`` would rate
another turn. AUTOINCREMENT (``sqlite_sequence``) never gives an id twice. It can only be
declared in CREATE TABLE, so SQLite's turns and ratings tables are rebuilt here.

They are not rebuilt with batch mode: it drops the old table, and with foreign keys on (which
cannot change inside the migration's transaction) SQLite's DROP TABLE deletes its rows
first, cascading to every rating. Instead the old tables are renamed aside (SQLite rewrites
the ratings' reference to the renamed turns), the new ones created under the real names and
filled, and the old ones dropped children first, so no cascade reaches a copied row.
PostgreSQL's sequences never reuse ids; it only changes the constraint.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TURN_COLUMNS = ["id", "conversation_id", "index", "user_message", "reply", "prompt_ids",
                "reply_ids", "logprobs", "checkpoint_id", "model", "gen_params", "created_at",
                "ttft_ms", "latency_ms", "interrupted", "context_forgotten"]
RATING_COLUMNS = ["id", "turn_id", "score", "tags", "comment", "critical", "created_at",
                  "updated_at"]


def turn_columns(picked: bool) -> list:
    columns = [
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
    ]
    if picked:
        columns.append(sa.Column("picked", sa.Boolean, nullable=False, server_default=sa.true()))
    else:
        columns.append(sa.UniqueConstraint("conversation_id", "index", name="uq_turn_position"))
    return columns


def rating_columns() -> list:
    return [
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
    ]


def create_picked_index() -> None:
    op.create_index("uq_turn_position", "turns", ["conversation_id", "index"], unique=True,
                    sqlite_where=sa.text("picked"), postgresql_where=sa.text("picked"))


def rebuild_sqlite(*, new: bool) -> None:
    """Rebuild turns and ratings: ``new`` = 0004's form (AUTOINCREMENT, picked), else 0003's.
    Every row is copied with its id; the sequence starts after the largest one."""
    op.rename_table("turns", "_turns_old")      # ratings now refers to _turns_old
    op.rename_table("ratings", "_ratings_old")
    op.drop_index("ix_turns_conversation_id", table_name="_turns_old")
    op.drop_index("ix_ratings_updated_at", table_name="_ratings_old")
    if not new:
        op.drop_index("uq_turn_position", table_name="_turns_old")
    op.create_table("turns", *turn_columns(picked=new), sqlite_autoincrement=new)
    op.create_table("ratings", *rating_columns(), sqlite_autoincrement=new)
    turn_names = ", ".join(f'"{c}"' for c in TURN_COLUMNS)
    rating_names = ", ".join(f'"{c}"' for c in RATING_COLUMNS)
    op.execute(f"INSERT INTO turns ({turn_names}) SELECT {turn_names} FROM _turns_old")
    op.execute(f"INSERT INTO ratings ({rating_names}) SELECT {rating_names} FROM _ratings_old")
    op.drop_table("_ratings_old")  # first: nothing refers to it
    op.drop_table("_turns_old")    # then nothing refers to this one either: no cascade
    op.create_index("ix_turns_conversation_id", "turns", ["conversation_id"])
    op.create_index("ix_ratings_updated_at", "ratings", ["updated_at"])
    if new:
        create_picked_index()


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        rebuild_sqlite(new=True)
    else:
        op.add_column("turns", sa.Column("picked", sa.Boolean, nullable=False,
                                         server_default=sa.true()))
        op.drop_constraint("uq_turn_position", "turns", type_="unique")
        create_picked_index()
    op.create_table(
        "pairs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("source", sa.String(20), nullable=False),
        sa.Column("outcome", sa.String(10), nullable=False),
        sa.Column("blind", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("conversation_id", sa.Integer,
                  sa.ForeignKey("conversations.id", ondelete="CASCADE")),
        sa.Column("prompt_turn_id", sa.Integer, sa.ForeignKey("turns.id", ondelete="CASCADE")),
        sa.Column("a_turn_id", sa.Integer, sa.ForeignKey("turns.id", ondelete="CASCADE")),
        sa.Column("b_turn_id", sa.Integer, sa.ForeignKey("turns.id", ondelete="CASCADE")),
        sa.Column("a_text", sa.Text),
        sa.Column("b_text", sa.Text),
        sa.Column("a_checkpoint_id", sa.String(64)),
        sa.Column("b_checkpoint_id", sa.String(64)),
        sa.Column("prompt_ids", sa.LargeBinary),
        sa.Column("a_reply_ids", sa.LargeBinary),
        sa.Column("b_reply_ids", sa.LargeBinary),
        sa.Column("details", sa.JSON, nullable=False),
        sa.CheckConstraint("outcome IN ('a', 'b', 'tie', 'both_bad')", name="ck_pair_outcome"),
        sa.CheckConstraint("source IN ('compare', 'regenerate')", name="ck_pair_source"),
        sa.CheckConstraint("a_turn_id IS NOT NULL OR a_text IS NOT NULL", name="ck_pair_a"),
        sa.CheckConstraint("b_turn_id IS NOT NULL OR b_text IS NOT NULL", name="ck_pair_b"),
        sqlite_autoincrement=True,
    )
    for column in ("conversation_id", "prompt_turn_id", "a_turn_id", "b_turn_id"):
        op.create_index(f"ix_pairs_{column}", "pairs", [column])


def downgrade() -> None:
    conn = op.get_bind()
    alternatives = conn.execute(sa.text("SELECT count(*) FROM turns WHERE NOT picked")).scalar()
    if alternatives:
        # 0003 holds one turn per position; dropping the others would lose them (and their
        # ratings), and moving them elsewhere would give them a context they never had.
        raise RuntimeError(f"cannot go back below revision 0004: {alternatives} turns are "
                           "alternative replies that 0003 cannot hold; forget them first "
                           "(`reinf forget --turn ID`)")
    for column in ("conversation_id", "prompt_turn_id", "a_turn_id", "b_turn_id"):
        op.drop_index(f"ix_pairs_{column}", table_name="pairs")
    op.drop_table("pairs")
    if conn.dialect.name == "sqlite":
        rebuild_sqlite(new=False)
    else:
        op.drop_index("uq_turn_position", table_name="turns")
        op.drop_column("turns", "picked")
        op.create_unique_constraint("uq_turn_position", "turns", ["conversation_id", "index"])
