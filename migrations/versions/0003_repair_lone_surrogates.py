"""Replace lone surrogates stored in JSON columns by U+FFFD.

Older versions could store a lone surrogate ("\\ud800") in a JSON column: json.dumps
escapes it as the ASCII text ``\\ud800``, which the database holds happily, but reading it
back gives a str that cannot be encoded to UTF-8, so every response or export that held it
failed. New writes refuse such text (reinf.storage.store.check_text); this repairs what is stored.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""
import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# (table, primary key, JSON column)
JSON_COLUMNS = [("turns", "id", "gen_params"), ("ratings", "id", "tags"),
                ("training_runs", "id", "metrics"), ("checkpoints", "id", "metrics")]
BATCH = 500  # rows read at a time: memory stays bounded on a large turns table
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def replace_lone_surrogates(value):
    """Parsed JSON ``value`` with every lone surrogate in its strings, dict keys included,
    replaced by U+FFFD. (json.loads joins an escaped pair into one character, so every
    surrogate left in a str is a lone one.)"""
    if isinstance(value, str):
        return LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [replace_lone_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {replace_lone_surrogates(k): replace_lone_surrogates(v) for k, v in value.items()}
    return value


def repair_column(conn, table_name: str, key: str, column: str) -> None:
    """Rewrite the rows of one JSON column that hold a lone surrogate; others are not touched.

    Rows are read in primary-key order, ``BATCH`` at a time (keyset paging: no cursor stays
    open while we update). The value is read as text (``CAST(... AS TEXT)``), so a driver
    that parses JSON itself (psycopg) never decodes it, and it is written back through the
    JSON type, which serializes it with json.dumps and casts it where the server needs it.
    """
    table = sa.table(table_name, sa.column(key), sa.column(column, sa.JSON))
    pk, col = table.c[key], table.c[column]
    query = sa.select(pk, sa.cast(col, sa.Text)).order_by(pk).limit(BATCH)
    after = None
    while True:
        rows = conn.execute(query if after is None else query.where(pk > after)).all()
        if not rows:
            return
        after = rows[-1][0]
        for row_id, raw in rows:
            if raw is None:
                continue
            try:
                value = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
            except ValueError:
                # Not JSON at all: not this migration's damage. Failing here would stop
                # every start-up over one row the app could not read anyway, so leave it.
                continue
            repaired = replace_lone_surrogates(value)
            # Compared as JSON text, not with ==: a NaN in metrics never equals itself.
            if json.dumps(repaired) != json.dumps(value):
                conn.execute(sa.update(table).where(pk == row_id).values({column: repaired}))


def upgrade() -> None:
    conn = op.get_bind()
    for table_name, key, column in JSON_COLUMNS:
        repair_column(conn, table_name, key, column)


def downgrade() -> None:
    # Nothing to undo: the replaced characters could not be encoded anyway, so putting them
    # back is neither possible (they were not recorded) nor useful, and U+FFFD is valid
    # text for every older version.
    pass
