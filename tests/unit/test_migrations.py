"""Migrations: from empty, down and up again, on a current DB, failures that stop start-up, and
each revision's data changes from an older schema."""
from __future__ import annotations

import json
import sqlite3
import threading
import time

import pytest
from sqlalchemy import inspect, text

from reinf.errors import StoreError
from reinf.storage import db
from reinf.storage.schema import Base
from reinf.storage.store import Store

TABLES = ["alembic_version", "checkpoints", "conversations", "pairs", "ratings", "rewrites",
          "training_runs", "turns"]


def test_upgrade_from_an_empty_db(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    assert db.table_names(store.engine) == TABLES
    assert db.current_revision(store.engine) == db.head_revision() == "0005"
    store.close()


def test_migrated_schema_matches_the_models(tmp_path):
    """The ORM models and the migrations describe the same columns."""
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    insp = inspect(store.engine)
    for table in Base.metadata.sorted_tables:
        migrated = {c["name"] for c in insp.get_columns(table.name)}
        assert migrated == {c.name for c in table.columns}, table.name
    store.close()


def test_downgrade_then_upgrade_again_keeps_working(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    conv = store.create_conversation()
    store.append_turn(conv.id, "x", "y")
    db.downgrade(store.engine, "base")
    assert db.table_names(store.engine) == ["alembic_version"]
    assert db.current_revision(store.engine) is None
    db.upgrade(store.engine)
    assert store.counts()["turns"] == 0
    store.append_turn(store.create_conversation().id, "again", "fine")
    assert store.counts()["turns"] == 1
    store.close()


def test_startup_on_a_current_db_keeps_data(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    store = Store(url)
    t = store.append_turn(store.create_conversation().id, "keep me", "ok")
    store.rate(t.id, 5)
    store.close()
    again = Store(url)  # runs migrations again: a no-op
    assert again.get_turn(t.id).rating.score == 5
    assert db.current_revision(again.engine) == db.head_revision()
    again.close()


def test_sqlite_pragmas_are_on(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}", busy_timeout_ms=1234)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 1234
    store.close()


def test_switching_a_new_file_to_wal_waits_for_another_writer(tmp_path):
    """Another process's write lock on a file not yet in WAL makes SQLite refuse the
    switch at once (no busy handler), as when three processes first open a new database
    together: the connection tries again within the busy timeout instead of failing."""
    path = tmp_path / "a.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    plain = sqlite3.connect(path, isolation_level=None, timeout=5)
    with pytest.raises(sqlite3.OperationalError, match="locked"):  # what SQLite itself does
        plain.execute("PRAGMA journal_mode=WAL")
    plain.close()
    release = threading.Timer(0.3, holder.execute, ("COMMIT",))
    release.start()
    engine = db.create_db_engine(f"sqlite:///{path}", busy_timeout_ms=5000)
    try:
        started = time.monotonic()
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert time.monotonic() - started >= 0.2  # it waited for the holder
    finally:
        release.join()
        engine.dispose()
        holder.close()


def test_a_write_lock_held_past_the_busy_timeout_is_the_locked_error(tmp_path):
    path = tmp_path / "a.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        with pytest.raises(db.LockedDatabase, match="locked by another process"):
            Store(f"sqlite:///{path}", busy_timeout_ms=300)
        assert 0.25 <= time.monotonic() - started < 10
    finally:
        holder.close()


def test_a_corrupt_db_stops_startup_with_a_clear_error(tmp_path):
    path = tmp_path / "a.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError) as info:
        Store(f"sqlite:///{path}")
    assert "migration" in str(info.value) and info.value.fix


def test_an_unknown_revision_is_not_swallowed(tmp_path):
    path = tmp_path / "a.db"
    Store(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StoreError, match="9999"):
        Store(f"sqlite:///{path}")


def test_a_failing_migration_rolls_back_and_stops_startup(tmp_path, monkeypatch):
    """Upgrade an old (empty, revision-less) DB where a table already exists with other
    columns: the migration fails, start-up stops, and the foreign table is untouched."""
    path = tmp_path / "a.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE turns (id INTEGER PRIMARY KEY, precious TEXT)")
        conn.execute("INSERT INTO turns (precious) VALUES ('do not lose me')")
    with pytest.raises(StoreError, match="already exists"):
        Store(f"sqlite:///{path}")
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT precious FROM turns").fetchall() == [("do not lose me",)]


def test_0002_adds_the_system_prompt_to_conversations_of_an_old_db(tmp_path):
    """A database at 0001 with conversations and turns: upgrading keeps every row, old
    conversations have no system prompt, and new ones can have one; downgrading drops
    the column and nothing else (no turn lost to a cascade)."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    old = Store(url, migrate=False)
    db.upgrade(old.engine, "0001")
    with old.engine.begin() as conn:
        conn.execute(text("INSERT INTO conversations (id, created_at, updated_at, title, "
                          "user_id) VALUES (1, '2026-01-01', '2026-01-01', 'old', 'local')"))
        conn.execute(text("INSERT INTO turns (conversation_id, \"index\", user_message, reply, "
                          "model, gen_params, created_at, interrupted, context_forgotten) "
                          "VALUES (1, 1, 'hi', 'hello', '', '{}', '2026-01-01', 0, 0)"))
    assert "system_prompt" not in {c["name"] for c in inspect(old.engine).get_columns(
        "conversations")}
    old.close()
    store = Store(url)  # start-up migrates
    assert db.current_revision(store.engine) == db.head_revision()
    conv = store.get_conversation(1)
    assert (conv.title, conv.turns, conv.system_prompt) == ("old", 1, None)
    assert store.conversation_turns(1)[0].system_prompt is None
    new = store.create_conversation(system_prompt="Be terse.")
    assert store.get_conversation(new.id).system_prompt == "Be terse."
    db.downgrade(store.engine, "0001")
    assert "system_prompt" not in {c["name"] for c in inspect(store.engine).get_columns(
        "conversations")}
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM turns")).scalar() == 1
        assert conn.execute(text("SELECT count(*) FROM conversations")).scalar() == 2
    db.upgrade(store.engine)
    assert store.get_conversation(new.id).system_prompt is None  # dropped with the column
    assert store.counts()["turns"] == 1
    store.close()


# Rows as an older Reinf wrote them: JSON text where json.dumps escaped a lone surrogate
# (r"\ud800"), beside clean rows that 0003 must leave byte for byte as they are (a valid
# escaped pair, r"\ud83d\ude00", is one character, not two lone surrogates).
OLD_ROWS = [
    "INSERT INTO conversations (id, created_at, updated_at, title, user_id) "
    "VALUES (1, '2026-01-01', '2026-01-01', 'old', 'local')",
    *(f"INSERT INTO turns (id, conversation_id, \"index\", user_message, reply, model, "
      f"gen_params, created_at, interrupted, context_forgotten) VALUES ({i}, 1, {i}, 'hi', "
      f"'hello', '', '{params}', '2026-01-01', FALSE, FALSE)"
      for i, params in [(1, r'{"temperature": 0.7, "stop": ["\ud800"]}'),
                        (2, r'{"temperature": 0.7}')]),
    *(f"INSERT INTO ratings (id, turn_id, score, tags, comment, critical, created_at, "
      f"updated_at) VALUES ({i}, {i}, 4, '{tags}', '', FALSE, '2026-01-01', '2026-01-01')"
      for i, tags in [(1, r'["ok", "bad \ud800 tag"]'), (2, r'["fine"]')]),
    *(f"INSERT INTO training_runs (id, started_at, status, \"trigger\", metrics, samples) "
      f"VALUES ({i}, '2026-01-01', 'succeeded', 'manual', '{metrics}', 3)"
      for i, metrics in [(1, r'{"loss": 0.5, "note\udfff": {"deep": ["x\uDBFF"]}}'),
                         (2, r'{"loss": 0.25}')]),
    *(f"INSERT INTO checkpoints (id, path, created_at, metrics, active, status) "
      f"VALUES ('{cid}', '/ckpt/{cid}', '2026-01-01', '{metrics}', FALSE, 'promoted')"
      for cid, metrics in [("r0001", r'{"sample": "\ud800\ud800"}'),
                           ("r0002", r'{"sample": "\ud83d\ude00"}')]),
]
CLEAN = {("turns", "gen_params", "2"): r'{"temperature": 0.7}',
         ("ratings", "tags", "2"): r'["fine"]',
         ("training_runs", "metrics", "2"): r'{"loss": 0.25}',
         ("checkpoints", "metrics", "'r0002'"): r'{"sample": "\ud83d\ude00"}'}


def raw_json(engine, table: str, column: str, key: str) -> str:
    """A JSON column's stored text, as the database holds it."""
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT CAST({column} AS TEXT) FROM {table} "
                                 f"WHERE id = {key}")).scalar_one()


def check_0003_repairs_lone_surrogates(url: str) -> None:
    """A database at 0002 whose JSON columns hold lone surrogates: after upgrading, the store
    reads them back as U+FFFD, every record encodes to UTF-8, and clean rows are unchanged.
    Shared with tests/e2e/test_postgres.py, which runs it on PostgreSQL too."""
    old = Store(url, migrate=False)
    db.upgrade(old.engine, "0002")
    with old.engine.begin() as conn:
        for sql in OLD_ROWS:
            conn.execute(text(sql))
    old.close()
    store = Store(url)  # start-up migrates
    assert db.current_revision(store.engine) == db.head_revision()
    turn = store.get_turn(1)
    assert turn.rating.tags == ["ok", "bad \ufffd tag"]
    assert turn.gen_params == {"temperature": 0.7, "stop": ["\ufffd"]}
    assert store.get_run(1).metrics == {"loss": 0.5, "note\ufffd": {"deep": ["x\ufffd"]}}
    assert store.get_checkpoint("r0001").metrics == {"sample": "\ufffd\ufffd"}
    assert store.get_checkpoint("r0002").metrics == {"sample": "\U0001F600"}
    assert store.get_turn(2).rating.tags == ["fine"]
    records = [turn.to_dict(), store.get_run(1).to_dict(), store.get_checkpoint("r0001").to_dict(),
               turn.gen_params]
    json.dumps(records, ensure_ascii=False).encode("utf-8")  # raised before the repair
    for (table, column, key), stored in CLEAN.items():
        assert raw_json(store.engine, table, column, key) == stored, table
    store.close()


def test_0003_replaces_lone_surrogates_in_the_json_of_an_old_db(tmp_path):
    check_0003_repairs_lone_surrogates(f"sqlite:///{tmp_path / 'a.db'}")


def test_0003_leaves_a_value_that_is_not_json_alone(tmp_path):
    """Not this migration's damage: it must not stop start-up over it."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    old = Store(url, migrate=False)
    db.upgrade(old.engine, "0002")
    with old.engine.begin() as conn:
        for sql in OLD_ROWS[:2]:
            conn.execute(text(sql))
        conn.execute(text("UPDATE turns SET gen_params = '{not json' WHERE id = 1"))
    old.close()
    store = Store(url)
    assert db.current_revision(store.engine) == db.head_revision()
    assert raw_json(store.engine, "turns", "gen_params", "1") == "{not json"
    store.close()
