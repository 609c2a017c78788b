"""Rewrites (the reply the person wanted) in the store and the HTTP API: one per turn,
replaced when written again, refused when empty or too long, gone with their turn, and
what a round reads of them (reinf.training.rewrites reads ``training_rewrites``)."""
from __future__ import annotations

import pytest

from reinf.errors import BadInput, NotFound
from reinf.storage.store import MAX_REWRITE_CHARS, Store
from reinf.training.rewrites import (Rewrites, best_rated_episodes, imitated_before,
                                     rewrite_pairs)
from webui_fakes import app, build_daemon, client, daemon, fake_chat  # noqa: F401 - fixtures


def turn(store, message="q", reply="a plain reply", conversation=None):
    conv = conversation or store.create_conversation("c").id
    return store.append_turn(conv, message, reply, prompt_ids=[1, 5, 1], reply_ids=[7, 8, 2],
                             logprobs=[-1.0, -1.0, -1.0], gen_params={"temperature": 0.7})


@pytest.fixture
def db(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    yield store
    store.close()


def test_one_rewrite_per_turn_replaced_when_written_again(db):
    t = turn(db)
    first = db.rewrite(t.id, "- one\n- two")
    assert (first.turn_id, first.text) == (t.id, "- one\n- two")
    again = db.rewrite(t.id, "1. one\n2. two")
    assert again.text == "1. one\n2. two" and again.created_at == first.created_at
    assert db.get_rewrite(t.id).text == "1. one\n2. two"
    assert db.get_turn(t.id).to_dict()["rewrite"]["text"] == "1. one\n2. two"
    assert db.history()[0].rewrite.text == "1. one\n2. two"
    assert db.delete_rewrite(t.id).text == "1. one\n2. two"
    assert db.get_rewrite(t.id) is None and db.delete_rewrite(t.id) is None
    assert db.get_turn(t.id).to_dict()["rewrite"] is None


@pytest.mark.parametrize("text, says", [("", "empty"), ("  \n\t", "empty"), (None, "NoneType"),
                                        (42, "int"), ("x" * (MAX_REWRITE_CHARS + 1), "20,000")])
def test_bad_rewrites_are_refused_and_nothing_is_stored(db, text, says):
    t = turn(db)
    with pytest.raises(BadInput, match=says) as info:
        db.rewrite(t.id, text)
    assert info.value.fix and db.get_rewrite(t.id) is None


def test_a_missing_turn_is_not_found(db):
    for call in (lambda: db.rewrite(404, "x"), lambda: db.get_rewrite(404),
                 lambda: db.delete_rewrite(404)):
        with pytest.raises(NotFound, match="no turn 404"):
            call()


def test_forget_takes_the_rewrite_with_its_turn(db):
    a, b = turn(db, "first"), turn(db, "second")
    c = turn(db, "third", conversation=db.create_conversation("other").id)
    for t in (a, b, c):
        db.rewrite(t.id, f"wanted {t.id}")
    assert db.forget_turn(a.id)["rewrites"] == 1
    assert [r.turn_id for r in db.training_rewrites(10)] == [c.id, b.id]
    assert db.forget_conversation(c.conversation_id)["rewrites"] == 1
    assert [r.turn_id for r in db.training_rewrites(10)] == [b.id]
    assert db.forget_all()["rewrites"] == 1
    assert db.training_rewrites(10) == [] and db.rewrites_since(None) == 0


def test_a_round_reads_rewrites_newest_first_with_their_turn(db):
    conv = db.create_conversation("c").id
    old, new = turn(db, "q1", conversation=conv), turn(db, "q2", conversation=conv)
    db.rewrite(old.id, "old wish")
    stamp = db.rewrite(new.id, "new wish").updated_at
    rows = db.training_rewrites(10)
    assert [(r.turn_id, r.text, r.prompt, r.reply) for r in rows] == \
        [(new.id, "new wish", "q2", "a plain reply"), (old.id, "old wish", "q1", "a plain reply")]
    assert rows[0].prompt_ids == [1, 5, 1] and rows[0].reply_ids == [7, 8, 2]
    assert rows[0].temperature == 0.7 and rows[0].conversation_id == conv
    assert [r.turn_id for r in db.training_rewrites(1)] == [new.id]
    assert [r.turn_id for r in db.training_rewrites(10, until=stamp)] == [new.id, old.id]
    assert db.rewrites_since(stamp) == 0 and db.rewrites_since(None) == 2
    # forgetting the first turn erases the second's context: it is no longer read
    db.forget_turn(old.id)
    assert db.training_rewrites(10) == []


def test_a_rewrite_is_new_to_an_adapter_whose_round_began_before_it(db):
    """imitated_before: when the round that made the checkpoint a round starts from began
    (it read every rewrite written before then); None where that is not known."""
    run = db.start_run("manual")
    db.add_checkpoint("c1", "/x/c1", run_id=run.id)
    db.add_checkpoint("c0", "/x/c0")                   # no run recorded
    db.add_checkpoint("c2", "/x/c2", run_id=run.id + 99)  # its run lost (db recover)
    assert imitated_before(db, "c1") == db.get_run(run.id).started_at
    assert imitated_before(db, None) is None
    assert imitated_before(db, "c0") is None and imitated_before(db, "c2") is None


def test_best_rated_episodes_are_the_ones_scored_at_the_threshold_or_above():
    """training.imitate_rated: which rated replies the imitation term reads beside the
    rewrites; under the once rule only those rated since the adapter's round began."""
    from datetime import datetime, timedelta, timezone
    from types import SimpleNamespace

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    samples = [SimpleNamespace(score=score, styled=False, rated_at=t0 + timedelta(minutes=i))
               for i, score in enumerate([5, 4, 1, 5, 3])]
    episodes = [(f"episode {i}",) for i in range(5)]
    assert best_rated_episodes(0, episodes, samples, imitated_before=None) == []
    assert best_rated_episodes(5, episodes, samples, imitated_before=None) == [
        episodes[0], episodes[3]]
    assert best_rated_episodes(4, episodes, samples, imitated_before=None) == [
        episodes[0], episodes[1], episodes[3]]
    # once: the adapter's round began at minute 2, so the first 5 is in it already
    assert best_rated_episodes(5, episodes, samples,
                               imitated_before=t0 + timedelta(minutes=2)) == [episodes[3]]
    with pytest.raises(ValueError):  # one sample per episode, or it is a bug
        best_rated_episodes(5, episodes, samples[:4], imitated_before=None)


def test_imitate_explored_reads_the_well_rated_replies_served_in_a_style_only():
    """training.imitate_explored: of the rated replies, those served in a style
    (explore_styles) and scored at the threshold or above; alone or beside imitate_rated."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    samples = [SimpleNamespace(score=score, styled=styled, rated_at=t0)
               for score, styled in [(5, True), (5, False), (4, True), (1, True), (4, False)]]
    episodes = [(f"episode {i}",) for i in range(5)]
    assert best_rated_episodes(0, episodes, samples, imitated_before=None, explored=5) == [
        episodes[0]]
    assert best_rated_episodes(0, episodes, samples, imitated_before=None, explored=4) == [
        episodes[0], episodes[2]]
    assert best_rated_episodes(5, episodes, samples, imitated_before=None, explored=4) == [
        episodes[0], episodes[1], episodes[2]]
    assert best_rated_episodes(0, episodes, samples, imitated_before=None, explored=0) == []


def test_an_explored_reply_is_imitated_only_when_rated_clearly_above_the_usual():
    """training.imitate_explored reads a styled 5 only where it stands at least
    EXPLORED_MARGIN above the person's mean rating: from someone who rates nearly
    everything 5 it says nothing of the style. imitate_rated has no such margin."""
    from datetime import datetime, timezone
    from types import SimpleNamespace

    from reinf.training.rewrites import EXPLORED_MARGIN

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    samples = [SimpleNamespace(score=score, styled=styled, rated_at=t0)
               for score, styled in [(5, True), (5, False), (4, True)]]
    episodes = [(f"episode {i}",) for i in range(3)]

    def pick(usual, threshold=0):
        return best_rated_episodes(threshold, episodes, samples, imitated_before=None,
                                   explored=4, usual=usual)

    assert pick(None) == [episodes[0], episodes[2]]
    assert pick(2.0) == [episodes[0], episodes[2]]
    assert pick(5 - EXPLORED_MARGIN) == [episodes[0]]     # the 5 just clears it
    assert pick(4.73) == []                               # no-question-back's base
    assert pick(4.73, threshold=5) == [episodes[0], episodes[1]]


def test_rewrite_pairs_reuse_a_rated_row_and_add_the_others():
    rewrites = Rewrites(originals=[([1, 5], [7, 2]), ([1, 6], [8, 2]), ([1, 9], [])])
    rewrites.samples = [object()] * 3
    rows = [([1, 5], [7, 2]), ([1, 5], [40, 2]), ([1, 6], [40, 2]), ([1, 9], [40, 2])]
    pairs = rewrite_pairs(rewrites, 1, rows)
    # rewrite 0 (row 1) over the rated row 0; rewrite 1 (row 2) over a new row 4; the third
    # turn had no reply to prefer the rewrite to
    assert pairs == [(1, 0, 1.0), (2, 4, 1.0)] and rows[4] == ([1, 6], [8, 2])


def test_the_api_writes_reads_and_removes_a_rewrite(client, store):
    tid = client.post("/api/chat", json={"message": "hi"}).get_json()["turn_id"]
    r = client.put(f"/api/turns/{tid}/rewrite", json={"text": "Hello! How can I help?"})
    assert r.status_code == 200 and r.get_json()["text"] == "Hello! How can I help?"
    assert client.get(f"/api/turns/{tid}").get_json()["rewrite"]["text"] == \
        "Hello! How can I help?"
    history = client.get("/api/history").get_json()["turns"]
    assert history[0]["rewrite"]["turn_id"] == tid
    r = client.put("/api/turns/last/rewrite", json={"text": "Hi."})
    assert r.get_json()["text"] == "Hi." and store.get_rewrite(tid).text == "Hi."
    r = client.delete(f"/api/turns/{tid}/rewrite")
    assert r.status_code == 200 and r.get_json()["removed"]["text"] == "Hi."
    assert client.delete(f"/api/turns/{tid}/rewrite").get_json() == {"removed": None}


def test_the_api_refuses_bad_rewrites_plainly(client, store):
    tid = client.post("/api/chat", json={"message": "hi"}).get_json()["turn_id"]
    for body in ({"text": "   "}, {"text": 3}, {}, {"text": "x", "score": 5}):
        r = client.put(f"/api/turns/{tid}/rewrite", json=body)
        assert r.status_code == 400 and r.get_json()["error"], body
    r = client.put(f"/api/turns/{tid}/rewrite", json={"text": "x" * (MAX_REWRITE_CHARS + 1)})
    assert r.status_code == 400 and "20,000" in r.get_json()["error"]
    assert client.put("/api/turns/4242/rewrite", json={"text": "x"}).status_code == 404
    assert client.delete("/api/turns/4242/rewrite").status_code == 404
    assert store.get_rewrite(tid) is None
