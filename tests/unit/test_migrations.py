"""Migrations: from empty, down and up again, on a current DB, and failures that stop start-up."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import inspect

from reinf import db
from reinf.errors import StoreError
from reinf.schema import Base
from reinf.store import Store

TABLES = ["alembic_version", "checkpoints", "conversations", "ratings", "training_runs", "turns"]


def test_upgrade_from_an_empty_db(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    assert db.table_names(store.engine) == TABLES
    assert db.current_revision(store.engine) == db.head_revision() == "0002"
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
    from sqlalchemy import text

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
    assert db.current_revision(store.engine) == "0002"
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
