"""The store on a real PostgreSQL server, side by side with SQLite.

``db_url`` promises any SQLAlchemy URL; these tests hold the promise for PostgreSQL. Most
run on both backends: a fresh SQLite file, and a fresh schema on one throwaway PostgreSQL
server per session (tests/pg.py; skipped, saying why, when PostgreSQL is not installed).
Besides their own checks they run the store's unit tests whose SQL differs between the two
(JSON, bytea, booleans, timestamps, LIKE, cascades, row locks), so those stay one source of
truth.
"""
from __future__ import annotations

import subprocess
import sys
import threading
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine, inspect, text

import test_concurrency
from reinf.errors import BadInput, StoreError
from reinf.storage import db
from reinf.storage.schema import Base, utcnow
from reinf.storage.store import Store
from unit import test_forget_export as forget_tests
from unit import test_migrations as migration_tests
from unit import test_pairs_store as pair_tests
from unit import test_store as store_tests

# One xdist process runs them all (`--dist loadgroup`), so the session fixture runs once.
pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("postgres")]

TABLES = ["alembic_version", "checkpoints", "conversations", "pairs", "ratings", "rewrites",
          "training_runs", "turns"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty database: a new SQLite file, or a new schema on the session's server."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'reinf.db'}"
        return
    server = request.getfixturevalue("pg_server")
    schema = server.create_schema()
    yield server.url(schema)
    server.drop_schema(schema)


@pytest.fixture
def store(db_url):
    s = Store(db_url)
    yield s
    s.close()


def test_the_server_is_found_off_path_or_the_tests_skip_saying_why(tmp_path):
    import pg

    assert pg.find_pg_bin({"REINF_TEST_PG_BIN": "off"}) is None
    assert "hidden by REINF_TEST_PG_BIN=off" in pg.missing_reason({"REINF_TEST_PG_BIN": "off"})
    reason = pg.missing_reason({"REINF_TEST_PG_BIN": str(tmp_path)})
    assert "no PostgreSQL server (initdb" in reason and "`postgresql` package" in reason
    for name in ("initdb", "pg_ctl", "postgres"):  # a directory Debian-style, off PATH
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert pg.find_pg_bin({"REINF_TEST_PG_BIN": str(tmp_path)}) == tmp_path


# --- migrations ------------------------------------------------------------------------

def test_upgrade_from_empty_reaches_the_current_revision(db_url):
    store = Store(db_url)
    assert db.table_names(store.engine) == TABLES
    assert db.current_revision(store.engine) == db.head_revision() == "0005"
    insp = inspect(store.engine)
    for table in Base.metadata.sorted_tables:
        assert {c["name"] for c in insp.get_columns(table.name)} == {
            c.name for c in table.columns}, table.name
    t = store.append_turn(store.create_conversation().id, "keep me", "ok")
    store.close()
    again = Store(db_url)  # start-up on a current DB: migrations are a no-op
    assert again.get_turn(t.id).user_message == "keep me"
    db.downgrade(again.engine, "base")
    assert db.table_names(again.engine) == ["alembic_version"]
    db.upgrade(again.engine)
    assert db.current_revision(again.engine) == db.head_revision() and \
        again.counts()["turns"] == 0
    again.close()


def test_0004_alternatives_and_pairs_down_and_up_with_data(db_url):
    """0004 on both backends, from 0003 holding rated turns: every row kept, all picked;
    down again (no alternatives) and up."""
    store = Store(db_url, migrate=False)
    db.upgrade(store.engine, "0003")
    with store.engine.begin() as conn:
        for row in pair_tests.OLD_ROWS:
            conn.execute(text(row))
        if store.engine.dialect.name == "postgresql":  # explicit ids: move the sequences on
            for table in ("conversations", "turns", "ratings"):
                conn.execute(text(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                                  f"(SELECT max(id) FROM {table}))"))
    db.upgrade(store.engine)
    assert [(t.id, t.picked, t.rating.score) for t in store.conversation_turns(1)] == \
        [(1, True, 3), (2, True, 4), (3, True, 5)]
    alt = store.append_turn(1, "q3", "again", slot=3)
    assert [t.id for t in store.conversation_turns(1)][-1] == alt.id
    store.forget_turn(alt.id)
    db.downgrade(store.engine, "0003")
    db.upgrade(store.engine)
    assert store.counts()["ratings"] == 3 and store.counts()["turns"] == 3
    store.close()


def test_0003_repairs_lone_surrogates_in_json_columns(db_url):
    """The data migration on both backends (PostgreSQL's driver parses JSON columns itself,
    and writing JSON there needs a cast)."""
    migration_tests.check_0003_repairs_lone_surrogates(db_url)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_postgresql_gets_native_column_types(store):
    cols = {c["name"]: type(c["type"]).__name__ for c in inspect(store.engine).get_columns("turns")}
    assert (cols["prompt_ids"], cols["interrupted"], cols["created_at"], cols["gen_params"]) == (
        "BYTEA", "BOOLEAN", "TIMESTAMP", "JSON")


def test_a_failing_migration_changes_nothing_and_lets_the_next_start_try_again(db_url):
    """A table in the way: start-up stops with the cause, the table and its row are
    untouched, nothing else was created, and the lock is free for the next attempt."""
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE turns (id INTEGER PRIMARY KEY, precious TEXT)"))
        conn.execute(text("INSERT INTO turns VALUES (1, 'do not lose me')"))
    for _ in range(2):
        with pytest.raises(StoreError, match="already exists"):
            Store(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT precious FROM turns")).scalars().all() == [
            "do not lose me"]
    assert "conversations" not in db.table_names(engine)
    engine.dispose()


STARTER = "import sys; from reinf.storage.store import Store; Store(sys.argv[1]).close()"


def test_processes_starting_at_once_on_an_empty_database_all_migrate(db_url):
    """The web server, the trainer and a CLI command may first start at once on a new
    database: one migrates, the others wait for it and find the schema current."""
    procs = [subprocess.Popen([sys.executable, "-c", STARTER, db_url], stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    store = Store(db_url, migrate=False)
    assert db.current_revision(store.engine) == db.head_revision()
    assert db.table_names(store.engine) == TABLES
    store.close()


# --- the store's own tests, on both backends -------------------------------------------

SHARED = [store_tests.test_turn_token_data_round_trips_compactly,
          store_tests.test_turn_indices_count_up_per_conversation,
          store_tests.test_rate_rerate_and_undo,
          store_tests.test_undo_removes_the_most_recent_rating,
          store_tests.test_history_filters,
          store_tests.test_history_tag_filter_is_exact_and_still_fills_the_limit,
          store_tests.test_training_query_newest_ratings_first_bounded,
          store_tests.test_ratings_waiting_counts_since_the_last_finished_run,
          store_tests.test_interrupted_runs_are_marked_failed,
          store_tests.test_checkpoints_activate_and_rollback_to_base,
          store_tests.test_record_json_is_stable,
          forget_tests.test_forget_turn_removes_it_everywhere_and_untrains_later_turns,
          forget_tests.test_forget_conversation_and_all,
          forget_tests.test_export_formats,
          pair_tests.test_an_alternative_shares_the_slot_and_becomes_the_path,
          pair_tests.test_only_the_last_slot_takes_alternatives,
          pair_tests.test_pick_records_a_pair_against_each_other_alternative,
          pair_tests.test_an_earlier_slot_cannot_change_its_pick,
          pair_tests.test_forgetting_the_picked_alternative_picks_the_newest_other,
          pair_tests.test_a_compare_pair_keeps_its_texts_checkpoints_and_tokens,
          pair_tests.test_list_pairs_filters,
          pair_tests.test_recent_prompts_are_distinct_newest_first,
          pair_tests.test_forget_turn_removes_the_pairs_that_hold_it,
          pair_tests.test_forget_conversation_and_all_remove_their_pairs]


@pytest.mark.parametrize("case", SHARED, ids=lambda f: f.__name__.removeprefix("test_"))
def test_store_behaves_the_same(store, case):
    case(store)


def test_timestamps_come_back_aware_utc_and_compare_across_zones(store):
    before = utcnow()
    t = store.append_turn(store.create_conversation().id, "when", "now")
    assert t.created_at.tzinfo is not None
    assert before <= store.get_turn(t.id).created_at <= utcnow()
    plus_two = timezone(timedelta(hours=2))
    assert store.history(since=before.astimezone(plus_two)) != []
    assert store.history(since=datetime.now(plus_two) + timedelta(minutes=1)) == []


def test_text_the_database_cannot_hold_is_bad_input_and_stores_nothing(store):
    """PostgreSQL refuses NUL characters in text and over-long VARCHARs (SQLite stores
    both): the person gets a 4xx-style BadInput, never a 500, and nothing half-written."""
    conv = store.create_conversation().id
    if store.engine.dialect.name != "postgresql":
        store.append_turn(conv, "nul \x00 inside", "ok")
        assert store.counts()["turns"] == 1
        return
    for call in (lambda: store.append_turn(conv, "nul \x00 inside", "ok"),
                 lambda: store.create_conversation(user_id="u" * 101)):
        with pytest.raises(BadInput, match="NUL|too long"):
            call()
    assert (store.counts()["conversations"], store.counts()["turns"]) == (1, 0)


# --- concurrency -----------------------------------------------------------------------

@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # SQLite: its own module
def test_two_writers_and_a_reader(store, tmp_path):
    """tests/e2e/test_concurrency.py: two processes write, one reads, every row counted."""
    test_concurrency.test_two_writers_and_a_reader(store, tmp_path)


def test_racing_writers_on_one_conversation_and_one_turn(store):
    """Appends to one conversation and re-rates of one turn, from many threads at once:
    each append gets its own index and the turn keeps exactly one rating (SQLite queues
    writers with BEGIN IMMEDIATE; PostgreSQL must lock the rows it reads to write)."""
    conv = store.create_conversation().id
    first = store.append_turn(conv, "first", "ok")
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def work(i):
        try:
            barrier.wait(10)
            for j in range(5):
                store.append_turn(conv, f"t{i}-{j}", "ok")
                store.rate(first.id, 1 + (i + j) % 5, tags=[f"w{i}"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    turns = store.conversation_turns(conv)
    assert [t.index for t in turns] == list(range(1, 42))
    assert store.counts()["ratings"] == 1
    assert store.integrity_check() == "ok"
