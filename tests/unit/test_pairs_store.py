"""Revision 0004 and what it holds: alternatives (turns sharing a slot, one picked), pairwise
preferences (pairs), ids that are never given twice, and forget taking pairs along.

Real SQLite files; the migrations are run from an older schema holding data."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import text

from reinf.errors import BadInput, Conflict, NotFound
from reinf.storage import db
from reinf.storage.store import Store


def talk(store, *messages, conversation_id=None):
    """Turns, one per message, in one conversation."""
    cid = conversation_id or store.create_conversation().id
    return [store.append_turn(cid, m, f"reply to {m}", reply_ids=[1, 2], logprobs=[-1.0, -1.0])
            for m in messages]


def again(store, turn, reply, *, picked=True):
    return store.append_turn(turn.conversation_id, turn.user_message, reply, reply_ids=[3],
                             logprobs=[-1.0], slot=turn.index, picked=picked)


# --- the migration ------------------------------------------------------------------------

OLD_ROWS = [
    "INSERT INTO conversations (id, created_at, updated_at, title, user_id) "
    "VALUES (1, '2026-01-01', '2026-01-01', 'old', 'local')",
    *(f"INSERT INTO turns (id, conversation_id, \"index\", user_message, reply, model, "
      f"gen_params, created_at, interrupted, context_forgotten) VALUES ({i}, 1, {i}, 'q{i}', "
      f"'r{i}', '', '{{}}', '2026-01-01', FALSE, FALSE)" for i in (1, 2, 3)),
    *(f"INSERT INTO ratings (id, turn_id, score, tags, comment, critical, created_at, "
      f"updated_at) VALUES ({i}, {i}, {i + 2}, '[\"t{i}\"]', 'c{i}', FALSE, '2026-01-01', "
      "'2026-01-01')" for i in (1, 2, 3)),
]


def old_database(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url, migrate=False)
    db.upgrade(old.engine, "0003")
    with old.engine.begin() as conn:
        for row in OLD_ROWS:
            conn.execute(text(row))
    old.close()
    return url


def test_0004_keeps_every_turn_and_rating_of_an_old_db(tmp_path):
    url = old_database(tmp_path)
    store = Store(url)  # start-up migrates
    assert db.current_revision(store.engine) == db.head_revision()
    turns = store.conversation_turns(1)
    assert [(t.id, t.user_message, t.picked, t.alternatives) for t in turns] == \
        [(1, "q1", True, 1), (2, "q2", True, 1), (3, "q3", True, 1)]
    assert [(t.rating.score, t.rating.tags, t.rating.comment) for t in turns] == \
        [(3, ["t1"], "c1"), (4, ["t2"], "c2"), (5, ["t3"], "c3")]
    with store.engine.connect() as conn:  # the rebuilt tables hold their constraints
        assert conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
        assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
        sql = conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE name = 'turns'").scalar()
    assert "AUTOINCREMENT" in sql
    with pytest.raises(Exception):  # ratings still refuse a score of 9
        store.rate(1, 9)
    store.close()


def test_0004_down_and_up_again_keeps_the_data(tmp_path):
    url = old_database(tmp_path)
    store = Store(url)
    db.downgrade(store.engine, "0003")
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM turns")).scalar() == 3
        assert conn.execute(text("SELECT count(*) FROM ratings")).scalar() == 3
        names = {r[0] for r in conn.exec_driver_sql("SELECT name FROM sqlite_master")}
    assert "pairs" not in names and not any(n.startswith("_") for n in names)
    with pytest.raises(sqlite3.IntegrityError):  # 0003's one turn per position is back
        raw = sqlite3.connect(tmp_path / "old.db")
        with raw:
            raw.execute("INSERT INTO turns (conversation_id, \"index\", user_message, reply, "
                        "model, gen_params, created_at, interrupted, context_forgotten) "
                        "VALUES (1, 3, 'x', 'y', '', '{}', '2026-01-01', 0, 0)")
    raw.close()
    db.upgrade(store.engine)
    assert store.counts()["ratings"] == 3
    assert [t.rating.score for t in store.conversation_turns(1)] == [3, 4, 5]
    store.close()


def test_going_below_0004_refuses_while_alternatives_exist(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    first, = talk(store, "q")
    again(store, first, "another")
    store.rate(first.id, 4)
    with pytest.raises(RuntimeError, match="alternative"):
        db.downgrade(store.engine, "0003")
    assert db.current_revision(store.engine) == db.head_revision()  # rolled back, nothing lost
    assert store.counts()["turns"] == 2 and store.get_turn(first.id).rating.score == 4
    store.close()


# --- ids are never given twice ------------------------------------------------------------

def test_a_forgotten_newest_turn_does_not_give_its_id_again(store):
    first, newest = talk(store, "a", "b")
    store.rate(newest.id, 5)
    store.forget_turn(newest.id)
    fresh, = talk(store, "c", conversation_id=first.conversation_id)
    assert fresh.id > newest.id
    store.rate(fresh.id, 3)
    with store.engine.connect() as conn:
        ids = [r[0] for r in conn.exec_driver_sql("SELECT id FROM ratings")]
    assert ids == [2]  # the forgotten turn's rating had id 1: not given again


def test_a_chatcmpl_id_of_a_forgotten_turn_never_rates_another(store):
    turn, = talk(store, "secret")
    store.forget_turn(turn.id)
    talk(store, "new")
    with pytest.raises(NotFound):
        store.rate(store.resolve_turn(f"chatcmpl-{turn.id}"), 5)


# --- alternatives ---------------------------------------------------------------------------

def test_an_alternative_shares_the_slot_and_becomes_the_path(store):
    q1, q2 = talk(store, "q1", "q2")
    alt = again(store, q2, "second try")
    assert (alt.conversation_id, alt.index, alt.picked, alt.alternatives) == \
        (q2.conversation_id, q2.index, True, 2)
    assert store.get_turn(q2.id).picked is False
    assert [t.id for t in store.conversation_turns(q1.conversation_id)] == [q1.id, alt.id]
    assert [t.id for t in store.conversation_turns(q1.conversation_id, alternatives=True)] == \
        [q1.id, q2.id, alt.id]
    assert [t.id for t in store.alternatives(q2.id)] == [q2.id, alt.id]
    kept = again(store, q2, "not picked", picked=False)
    assert kept.picked is False and store.get_turn(alt.id).picked is True
    assert store.get_turn(q1.id).alternatives == 1 and store.get_turn(q2.id).alternatives == 3


def test_only_the_last_slot_takes_alternatives(store):
    q1, q2 = talk(store, "q1", "q2")
    with pytest.raises(Conflict, match="went on"):
        again(store, q1, "too late")
    assert store.counts()["turns"] == 2


def test_pick_records_a_pair_against_each_other_alternative(store):
    q, = talk(store, "q")
    alt1 = again(store, q, "second")
    alt2 = again(store, q, "third")
    turn, pairs = store.pick_alternative(alt1.id)
    assert turn.picked and not store.get_turn(alt2.id).picked
    assert {(p.a_turn_id, p.b_turn_id, p.outcome, p.source) for p in pairs} == \
        {(alt1.id, q.id, "a", "regenerate"), (alt1.id, alt2.id, "a", "regenerate")}
    assert [p.a_text for p in pairs] == ["second", "second"] and pairs[0].prompt == "q"
    # picking another replaces the outcome of the pair of the two, adds none twice
    turn, pairs = store.pick_alternative(q.id)
    by_turns = {(p.a_turn_id, p.b_turn_id): p.outcome for p in store.list_pairs()}
    assert by_turns == {(alt1.id, q.id): "b", (alt1.id, alt2.id): "a", (q.id, alt2.id): "a"}
    assert [t.id for t in store.conversation_turns(q.conversation_id)] == [q.id]


def test_an_earlier_slot_cannot_change_its_pick(store):
    q1, = talk(store, "q1")
    alt = again(store, q1, "second")
    talk(store, "q2", conversation_id=q1.conversation_id)
    with pytest.raises(Conflict, match="went on"):
        store.pick_alternative(q1.id)
    _, pairs = store.pick_alternative(alt.id)  # the picked one: the pair, nothing else
    assert [(p.a_turn_id, p.outcome) for p in pairs] == [(alt.id, "a")]


def test_forgetting_the_picked_alternative_picks_the_newest_other(store):
    q, = talk(store, "q")
    alt = again(store, q, "second")
    later, = talk(store, "next", conversation_id=q.conversation_id)
    result = store.forget_turn(alt.id)
    assert result["alternatives_kept"] == 1 and result["later_turns_untrainable"] == 1
    assert store.get_turn(q.id).picked and store.get_turn(later.id).context_forgotten


def test_forgetting_an_alternative_that_is_not_picked_leaves_later_turns(store):
    q, = talk(store, "q")
    alt = again(store, q, "second", picked=False)
    later, = talk(store, "next", conversation_id=q.conversation_id)
    assert store.forget_turn(alt.id)["later_turns_untrainable"] == 0
    assert not store.get_turn(later.id).context_forgotten and store.get_turn(q.id).picked


# --- pairs ----------------------------------------------------------------------------------

def compare_pair(store, prompt="typed prompt", **extra):
    return store.add_pair(prompt, "a", a_text="from base", b_text="from r1",
                          a_checkpoint_id=None, b_checkpoint_id="r1", blind=True,
                          prompt_ids=[5, 6], a_reply_ids=[7], b_reply_ids=[8, 9], **extra)


def test_a_compare_pair_keeps_its_texts_checkpoints_and_tokens(store):
    pair = compare_pair(store, details={"compare_id": "x"})
    got, = store.list_pairs()
    assert got == pair
    assert (got.source, got.outcome, got.winner, got.blind) == ("compare", "a", "a", True)
    assert (got.a_checkpoint_id, got.b_checkpoint_id) == (None, "r1")
    assert (got.prompt_ids, got.a_reply_ids, got.b_reply_ids) == ([5, 6], [7], [8, 9])
    d = got.to_dict()
    assert d["a"] == {"turn_id": None, "text": "from base", "checkpoint_id": "base"}
    assert d["details"] == {"compare_id": "x"} and store.counts()["pairs"] == 1


@pytest.mark.parametrize("fields,match", [
    ({"outcome": "c"}, "outcome"),
    ({"source": "guess"}, "source"),
    ({"a_text": None}, "neither"),
    ({"a_turn_id": 1}, "both"),
])
def test_a_bad_pair_is_refused_and_nothing_stored(store, fields, match):
    talk(store, "q")
    row = {"prompt": "p", "outcome": "a", "a_text": "x", "b_text": "y", **fields}
    with pytest.raises(BadInput, match=match):
        store.add_pairs([row])
    assert store.counts()["pairs"] == 0


def test_pairs_of_a_forgotten_prompt_turn_are_refused(store):
    q, = talk(store, "q")
    store.forget_turn(q.id)
    with pytest.raises(NotFound, match="forgotten"):
        compare_pair(store, "q", prompt_turn_id=q.id)
    assert store.counts()["pairs"] == 0


def test_list_pairs_filters(store):
    q, = talk(store, "q")
    alt = again(store, q, "again")
    store.pick_alternative(q.id)
    compare_pair(store, prompt_turn_id=q.id)
    compare_pair(store, "other")
    assert len(store.list_pairs()) == 3
    assert [p.source for p in store.list_pairs(source="regenerate")] == ["regenerate"]
    assert len(store.list_pairs(turn_id=alt.id)) == 1
    assert len(store.list_pairs(turn_id=q.id)) == 2  # a side, and the prompt of another
    assert len(store.list_pairs(checkpoint_id="r1")) == 2
    assert len(store.list_pairs(checkpoint_id=None)) == 3   # base on a side
    assert len(store.list_pairs(conversation_id=q.conversation_id)) == 2
    assert len(store.list_pairs(limit=1)) == 1
    with pytest.raises(BadInput):
        store.list_pairs(outcome="win")


def test_recent_prompts_are_distinct_newest_first(store):
    a, b = talk(store, "same", "other")
    c, = talk(store, "same")
    assert [(p["prompt"], p["turn_id"]) for p in store.recent_prompts()] == \
        [("same", c.id), ("other", b.id)]
    assert len(store.recent_prompts(limit=1)) == 1


# --- forget takes the pairs along -----------------------------------------------------------

def test_forget_turn_removes_the_pairs_that_hold_it(store):
    q, = talk(store, "q")
    alt = again(store, q, "again")
    store.pick_alternative(alt.id)              # regenerate pair: q and alt
    compare_pair(store, prompt_turn_id=q.id)   # compare on q's prompt
    compare_pair(store, "q")                   # typed, the same text: q's siblings hold it
    compare_pair(store, "unrelated")
    result = store.forget_turn(q.id)
    assert result["pairs"] == 2 and store.counts()["pairs"] == 2
    # the last turn holding "q" goes: the typed compare on "q" goes with it
    assert store.forget_turn(alt.id)["pairs"] == 1
    assert [p.prompt for p in store.list_pairs()] == ["unrelated"]


def test_forgetting_an_earlier_turn_scrubs_the_prompt_ids_of_a_later_turns_compare(store):
    """A later turn's prompt held the forgotten reply; forget empties that turn's prompt ids
    (context_forgotten), and a compare pair on it kept a copy of them: emptied too."""
    first, later = talk(store, "my secret", "go on")
    compare_pair(store, "go on", prompt_turn_id=later.id)
    store.forget_turn(first.id)
    pair, = store.list_pairs()
    assert not pair.prompt_ids
    assert store.get_turn(later.id).context_forgotten


def test_forget_conversation_and_all_remove_their_pairs(store):
    q, = talk(store, "secret question")
    again(store, q, "again")
    store.pick_alternative(q.id)
    compare_pair(store, "secret question")
    compare_pair(store, "kept")
    other, = talk(store, "kept")  # another conversation holds this text
    result = store.forget_conversation(q.conversation_id)
    assert result["pairs"] == 2 and [p.prompt for p in store.list_pairs()] == ["kept"]
    # the last turn holding "kept" goes: so does the comparison typed with that text
    assert store.forget_conversation(other.conversation_id)["pairs"] == 1
    compare_pair(store, "typed, in no conversation")
    assert store.forget_all()["pairs"] == 1 and store.counts()["pairs"] == 0


def test_a_forgotten_pair_leaves_no_text_in_the_database_file(store, config):
    """secure_delete and the WAL scrub, as for turns: the reply text of a forgotten
    comparison is not on disk any more."""
    q, = talk(store, "plain prompt")
    store.add_pair("plain prompt", "b", a_text="zebra-canary-7431", b_text="x",
                   prompt_turn_id=q.id)
    store.forget_turn(q.id)
    store.close()
    path = config.data_dir / "reinf.db"
    data = b"".join(p.read_bytes() for p in path.parent.glob("reinf.db*") if p.is_file())
    assert b"zebra-canary-7431" not in data
