"""The store: turns with compact token data, ratings, history, training query, runs."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import event

from reinf.errors import BadInput, NotFound
from reinf.storage.schema import Turn, utcnow


def add_turn(store, conv=None, msg="hi", reply="hello", n=3, **kw):
    conv = conv or store.create_conversation().id
    return store.append_turn(conv, msg, reply, prompt_ids=list(range(1, 6)),
                             reply_ids=list(range(10, 10 + n)),
                             logprobs=[-0.5 - i / 7 for i in range(n)],
                             gen_params={"temperature": 0.7}, **kw)


def test_turn_token_data_round_trips_compactly(store):
    t = add_turn(store, n=200)
    back = store.get_turn(t.id)
    assert back.prompt_ids == [1, 2, 3, 4, 5]
    assert back.reply_ids == list(range(10, 210))
    assert back.logprobs == pytest.approx([-0.5 - i / 7 for i in range(200)], abs=1e-6)
    with store.engine.connect() as conn:
        size = conn.exec_driver_sql("SELECT length(logprobs) FROM turns").scalar()
    assert size == 200 * 4  # float32, not JSON text


def test_turn_indices_count_up_per_conversation(store):
    conv = store.create_conversation().id
    assert [add_turn(store, conv).index for _ in range(3)] == [1, 2, 3]
    assert store.get_conversation(conv).title == "hi"
    assert [t.index for t in store.conversation_turns(conv)] == [1, 2, 3]


def test_mismatched_logprobs_are_rejected(store):
    conv = store.create_conversation().id
    with pytest.raises(BadInput):
        store.append_turn(conv, "a", "b", reply_ids=[1, 2], logprobs=[-1.0])
    with pytest.raises(BadInput):
        store.append_turn(conv, "a", "b", reply_ids=[1], logprobs=[float("nan")])


def test_rate_rerate_and_undo(store):
    t = add_turn(store)
    first = store.rate(t.id, 2, tags="too long, wrong ,too long", comment="meh")
    assert first.tags == ["too long", "wrong"]
    second = store.rate(t.id, "5", critical=True)
    assert second.score == 5 and second.critical and second.created_at == first.created_at
    assert second.updated_at >= first.updated_at
    assert store.counts()["ratings"] == 1  # re-rating replaces
    removed = store.undo_rating()
    assert removed.score == 5
    assert store.get_turn(t.id).rating is None
    assert store.undo_rating() is None


def test_undo_removes_the_most_recent_rating(store):
    a, b = add_turn(store), add_turn(store)
    store.rate(b.id, 4)
    store.rate(a.id, 3)
    assert store.undo_rating().turn_id == a.id
    assert store.get_turn(b.id).rating.score == 4


@pytest.mark.parametrize("score", [0, 6, 4.5, "five", None, True, -1])
def test_bad_scores_are_rejected_and_nothing_is_stored(store, score):
    t = add_turn(store)
    with pytest.raises(BadInput, match="1 to 5"):
        store.rate(t.id, score)
    assert store.counts()["ratings"] == 0


def test_bad_rating_fields(store):
    t = add_turn(store)
    with pytest.raises(BadInput):
        store.rate(t.id, 3, tags=[1, 2])
    with pytest.raises(BadInput):
        store.rate(t.id, 3, tags=["x" * 100])
    with pytest.raises(BadInput):
        store.rate(t.id, 3, comment="x" * 5000)
    with pytest.raises(BadInput):
        store.rate(t.id, 3, critical="yes")
    with pytest.raises(NotFound):
        store.rate(999, 3)


def test_the_store_refuses_text_that_is_not_utf8_as_a_second_line(store):
    conv = store.create_conversation().id
    turn = store.append_turn(conv, "q", "a")
    for call in (lambda: store.rate(turn.id, 3, tags="fine,bad \ud800"),
                 lambda: store.rate(turn.id, 3, comment="\udc80"),
                 lambda: store.append_turn(conv, "\ud800", "a"),
                 lambda: store.append_turn(conv, "q", "\ud800"),
                 lambda: store.create_conversation(user_id="\ud800"),
                 lambda: store.create_conversation(title="\ud800")):
        with pytest.raises(BadInput, match="surrogate"):
            call()
    counts = store.counts()
    assert (counts["conversations"], counts["turns"], counts["ratings"]) == (1, 1, 0)
    assert [t.rating for t in store.history(limit=None)] == [None]


def test_history_filters(store):
    turns = [add_turn(store, msg=f"m{i}") for i in range(5)]
    store.rate(turns[0].id, 1, tags=["wrong"])
    store.rate(turns[1].id, 5, tags=["great tone"])
    store.rate(turns[2].id, 4)
    assert [t.user_message for t in store.history(limit=2)] == ["m4", "m3"]
    assert {t.id for t in store.history(rated=True)} == {t.id for t in turns[:3]}
    assert {t.id for t in store.history(rated=False)} == {t.id for t in turns[3:]}
    assert [t.id for t in store.history(min_score=4)] == [turns[2].id, turns[1].id]
    assert [t.id for t in store.history(max_score=1)] == [turns[0].id]
    assert [t.id for t in store.history(tag="great tone")] == [turns[1].id]
    future = utcnow() + timedelta(days=1)
    assert store.history(since=future) == []
    assert len(store.history(until=future, limit=None)) == 5


@pytest.fixture
def turns_read():
    """How many turn rows the ORM has built objects from (reset it with ``[0] = 0``)."""
    count = [0]

    def on_load(target, context):
        count[0] += 1
    event.listen(Turn, "load", on_load)
    yield count
    event.remove(Turn, "load", on_load)


def test_history_reads_only_the_rows_it_returns(store, turns_read):
    conv = store.create_conversation().id
    turns = [add_turn(store, conv, msg=f"m{i}") for i in range(200)]
    for i in (10, 61, 110, 160):  # not re-rated "common" below
        store.rate(turns[i].id, 4, tags=["rare", "x"])
    for t in turns[::3]:
        store.rate(t.id, 2, tags=["common"])
    turns_read[0] = 0
    assert [t.user_message for t in store.history(limit=5)] == [f"m{i}" for i in
                                                                 range(199, 194, -1)]
    assert turns_read[0] == 5
    turns_read[0] = 0
    assert [t.user_message for t in store.history(limit=3, oldest_first=True)] == [
        "m0", "m1", "m2"]
    assert turns_read[0] == 3
    turns_read[0] = 0
    assert [t.user_message for t in store.history(tag="rare", limit=2)] == ["m160", "m110"]
    assert turns_read[0] == 2
    turns_read[0] = 0
    assert len(store.history(tag="common", limit=5, oldest_first=True)) == 5
    assert turns_read[0] == 5
    assert [t.user_message for t in store.history(tag="rare", limit=None)] == [
        "m160", "m110", "m61", "m10"]
    assert store.history(limit=0) == []


def test_history_tag_filter_is_exact_and_still_fills_the_limit(store):
    """The SQL pre-filter (a LIKE on the JSON text) keeps a few wrong rows; they are dropped
    and the next rows read, so a page still holds ``limit`` exact matches."""
    messages = []
    for tags in (["wrong"], ["100%"], ["a_b"], ['say "hi"'], ["back\\slash"], ["café"],
                 ["1000"], ["axb"], ["x\"wrong"], ["Wrong"], ["wrongly"], ["WRONG", "ok"]):
        t = add_turn(store, msg="/".join(tags))
        store.rate(t.id, 3, tags=tags)
        messages.append(t.user_message)
    assert [t.user_message for t in store.history(tag="wrong", limit=1)] == ["wrong"]
    for tag in ("100%", "a_b", 'say "hi"', "back\\slash", "café", "Wrong", "ok"):
        assert [t.user_message for t in store.history(tag=tag, limit=1)] == [
            next(m for m in messages if tag in m.split("/"))], tag
    assert store.history(tag="1%", limit=5) == [] and store.history(tag="a", limit=5) == []
    assert store.history(tag="wrong", rated=False) == []


def test_training_query_newest_ratings_first_bounded(store):
    turns = [add_turn(store, msg=f"m{i}") for i in range(6)]
    for t in turns:
        store.rate(t.id, 3)
    store.rate(turns[0].id, 5)  # re-rated last: now the newest rating
    samples = store.training_samples(limit=4)
    assert [s.turn_id for s in samples] == [turns[0].id, turns[5].id, turns[4].id, turns[3].id]
    s = samples[0]
    assert s.score == 5 and s.prompt == "m0" and s.temperature == pytest.approx(0.7)
    assert s.reply_ids == [10, 11, 12] and len(s.logprobs) == 3
    assert s.rated_at.tzinfo is not None


def test_ratings_waiting_counts_since_the_last_finished_run(store):
    a, b = add_turn(store), add_turn(store)
    store.rate(a.id, 4)
    assert store.ratings_waiting() == 1
    run = store.start_run("manual")
    store.rate(b.id, 2)  # arrives while the run trains: still waiting afterwards
    store.finish_run(run.id, "succeeded", metrics={"kl": 0.01}, samples=1)
    assert store.ratings_waiting() == 1
    failed = store.start_run()
    store.finish_run(failed.id, "failed", error="boom")
    assert store.ratings_waiting() == 1  # a failed run consumed nothing


def test_interrupted_runs_are_marked_failed(store):
    run = store.start_run("schedule", pid=123)
    assert store.mark_interrupted_runs() == 1
    back = store.get_run(run.id)
    assert back.status == "failed" and back.error == "interrupted" and back.finished_at


def test_checkpoints_activate_and_rollback_to_base(store):
    store.add_checkpoint("ckpt-1", "/x/1", metrics={"reward_mean": 0.1})
    store.add_checkpoint("ckpt-2", "/x/2", parent_id="ckpt-1")
    store.add_checkpoint("ckpt-3", "/x/3", parent_id="ckpt-2", status="rejected")
    assert store.activate_checkpoint("ckpt-2").active
    assert store.active_checkpoint().id == "ckpt-2"
    store.activate_checkpoint("ckpt-1")
    assert [c.id for c in store.list_checkpoints() if c.active] == ["ckpt-1"]
    with pytest.raises(BadInput, match="rejected"):
        store.activate_checkpoint("ckpt-3")
    with pytest.raises(NotFound):
        store.activate_checkpoint("nope")
    assert store.activate_checkpoint(None) is None
    assert store.active_checkpoint() is None


CKPT_A = "r0005-20261125-030648-8ce1"
CKPT_B = "r0006-20261126-101500-03af"
CKPT_C = "r0006-20261126-113000-77b0"


def test_a_checkpoint_is_named_by_its_id_or_a_unique_prefix(store):
    for ckpt in (CKPT_A, CKPT_B, CKPT_C):
        store.add_checkpoint(ckpt, f"/x/{ckpt}")
    assert store.resolve_checkpoint(CKPT_A) == CKPT_A
    assert store.resolve_checkpoint("r0005") == CKPT_A
    assert store.resolve_checkpoint(" r0006-20261126-10 ") == CKPT_B  # pasted with spaces
    assert store.resolve_checkpoint("base") is None
    with pytest.raises(BadInput) as ambiguous:
        store.resolve_checkpoint("r0006")
    assert str(ambiguous.value).count("\n") == 0
    assert f"ambiguous: 2 checkpoints start with it ({CKPT_B}, {CKPT_C})" in str(ambiguous.value)
    with pytest.raises(NotFound, match="^no checkpoint r0009 — list them with `reinf checkp"):
        store.resolve_checkpoint("r0009")
    with pytest.raises(NotFound):  # SQLite's LIKE ignores case; ids do not
        store.resolve_checkpoint("R0005")
    with pytest.raises(NotFound):  # LIKE wildcards are literal
        store.resolve_checkpoint("r000_")
    with pytest.raises(BadInput, match="no checkpoint id given"):
        store.resolve_checkpoint("  ")


def test_an_exact_checkpoint_id_wins_over_a_longer_one_it_starts(store):
    store.add_checkpoint("ckpt-1", "/x/1")
    store.add_checkpoint("ckpt-10", "/x/10")
    assert store.resolve_checkpoint("ckpt-1") == "ckpt-1"
    assert store.resolve_checkpoint("ckpt-10") == "ckpt-10"
    with pytest.raises(BadInput, match="ambiguous"):
        store.resolve_checkpoint("ckpt-")


def test_an_ambiguous_prefix_lists_at_most_ten_candidates(store):
    for i in range(13):
        store.add_checkpoint(f"c{i:02d}", f"/x/{i}")
    with pytest.raises(BadInput, match=r"\(c00, c01, .*, c09 and 3 more\)"):
        store.resolve_checkpoint("c")


def test_a_turn_is_named_by_last_its_number_or_its_completion_id(store):
    with pytest.raises(NotFound, match="no turns yet"):
        store.resolve_turn("last")
    first = add_turn(store)
    conv = first.conversation_id
    streamed = store.append_turn(conv, "q", "a", gen_params={"stream_id": "ab" * 16})
    assert store.resolve_turn("last") == streamed.id
    assert store.resolve_turn(str(first.id)) == first.id
    assert store.resolve_turn(f"chatcmpl-{first.id}") == first.id
    assert store.resolve_turn("chatcmpl-stream-" + "ab" * 16) == streamed.id
    with pytest.raises(NotFound, match="no turn for the completion chatcmpl-stream-cdcd"):
        store.resolve_turn("chatcmpl-stream-" + "cd" * 16)


@pytest.mark.parametrize("ref", ["first", "0", "-3", "chatcmpl-", "chatcmpl-x1", "٣",
                                 "chatcmpl-stream-ffff", "chatcmpl-stream-" + "AB" * 16,
                                 "1" * 19, "x" * 500])
def test_a_malformed_turn_is_one_line_naming_the_forms(store, ref):
    add_turn(store)
    with pytest.raises(BadInput) as bad:
        store.resolve_turn(ref)
    message = str(bad.value)
    assert "\n" not in message and len(message) < 200
    assert "`last`, a turn number, or an OpenAI completion id `chatcmpl-…`" in message


def test_record_json_is_stable(store):
    t = add_turn(store)
    store.rate(t.id, 4, tags=["wrong"])
    d = store.get_turn(t.id).to_dict()
    assert set(d) == {"turn_id", "conversation_id", "index", "created_at", "user_message",
                      "reply", "checkpoint_id", "model", "reply_tokens", "ttft_ms",
                      "latency_ms", "interrupted", "rating", "system_prompt", "picked",
                      "alternatives", "rewrite", "style"}
    assert d["checkpoint_id"] == "base" and d["rating"]["score"] == 4
    assert "prompt_ids" in store.get_turn(t.id).to_dict(tokens=True)


# --- a conversation's system prompt --------------------------------------------------------

def test_a_conversation_keeps_its_system_prompt(store):
    from reinf.errors import Conflict

    plain = store.create_conversation()
    assert plain.system_prompt is None and plain.to_dict()["system_prompt"] is None
    conv = store.create_conversation(system_prompt="  Be terse.\n")
    assert store.get_conversation(conv.id).system_prompt == "Be terse."  # stored trimmed
    assert store.list_conversations()[0].to_dict()["system_prompt"] == "Be terse."
    # before its first turn it may change, and blank means none
    assert store.update_conversation(conv.id, system_prompt="Be kind.").system_prompt == \
        "Be kind."
    assert store.update_conversation(conv.id, system_prompt=" ").system_prompt is None
    store.update_conversation(conv.id, system_prompt="Be kind.")
    t = add_turn(store, conv.id)
    assert t.system_prompt == "Be kind." and t.to_dict()["system_prompt"] == "Be kind."
    assert store.get_turn(t.id).system_prompt == "Be kind."
    assert store.history(limit=1)[0].system_prompt == "Be kind."
    # after it, the turns' prompt tokens hold it: it stays
    with pytest.raises(Conflict, match="already has 1 turn;") as err:
        store.update_conversation(conv.id, system_prompt="Be rude.")
    assert err.value.status == 409 and "new conversation" in err.value.fix
    assert store.get_conversation(conv.id).system_prompt == "Be kind."
    with pytest.raises(NotFound):
        store.update_conversation(9999, system_prompt="x")
    with pytest.raises(BadInput, match="must be text"):
        store.create_conversation(system_prompt=5)
    with pytest.raises(BadInput, match="not valid Unicode"):
        store.update_conversation(plain.id, system_prompt="a\ud800")
    assert store.forget_conversation(conv.id)["turns"] == 1
    with pytest.raises(NotFound):
        store.get_conversation(conv.id)


def test_promote_records_activates_and_finishes_the_run_in_one_transaction(store):
    """A round's end is all or nothing: a failure part-way (here at the run's update, as
    a kill would leave it) records no checkpoint, keeps the active one, leaves the run
    running; never an active checkpoint beside an unfinished run."""
    first = store.start_run("test")
    store.promote(first.id, "c1", "/ckpt/c1", parent_id=None, metrics={"kl": 0.1}, samples=2)
    run = store.start_run("test")

    def fail_at_the_run(conn, cursor, statement, *args):
        if statement.lstrip().upper().startswith("UPDATE TRAINING_RUNS"):
            raise RuntimeError("the disk went away")
    event.listen(store.engine, "before_cursor_execute", fail_at_the_run)
    with pytest.raises(RuntimeError):
        store.promote(run.id, "c2", "/ckpt/c2", parent_id="c1", metrics={}, samples=1)
    event.remove(store.engine, "before_cursor_execute", fail_at_the_run)
    assert [c.id for c in store.list_checkpoints()] == ["c1"]
    assert store.active_checkpoint().id == "c1"
    assert store.get_run(run.id).status == "running"

    record = store.promote(run.id, "c2", "/ckpt/c2", parent_id="c1", metrics={"kl": 0.2},
                           samples=1)
    assert record.active and record.parent_id == "c1" and record.status == "promoted"
    assert store.active_checkpoint().id == "c2" and not store.get_checkpoint("c1").active
    done = store.get_run(run.id)
    assert (done.status, done.checkpoint_id, done.samples, done.metrics, done.error) == \
        ("succeeded", "c2", 1, {"kl": 0.2}, None)
    assert done.finished_at is not None
    with pytest.raises(NotFound):
        store.promote(999, "c3", "/ckpt/c3", parent_id="c2", metrics={}, samples=0)
    assert store.active_checkpoint().id == "c2"


def test_a_round_that_trained_on_turns_forgotten_while_it_ran_is_not_promoted(config, store):
    """Forget races: a round reads its rated turns, a turn (or the context of one) is
    forgotten while it trains; the promotion refuses in its own transaction, the run is
    rejected saying how many, the active checkpoint stays, and the files are removed."""
    from reinf.training import checkpoints
    from reinf.training.promotion import promote

    conv = store.create_conversation().id
    kept, lost, after = (add_turn(store, conv, msg=m) for m in ("a", "my secret is X", "b"))
    other = add_turn(store)
    for turn in (kept, lost, after, other):
        store.rate(turn.id, 5)
    first = store.start_run("test")
    store.promote(first.id, "c1", "/ckpt/c1", parent_id=None, metrics={}, samples=1,
                  turn_ids=[other.id])
    run = store.start_run("test")
    read_at = utcnow()
    trained_on = [t.turn_id for t in store.training_samples(10)]
    assert sorted(trained_on) == sorted([kept.id, lost.id, after.id, other.id])
    store.forget_turn(lost.id)  # `after` loses its context too
    add_turn(store)  # may take the forgotten turn's id again: not the turn trained on
    path = checkpoints.root_dir(config) / "c2"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_text("weights")
    record = promote(config, store, run.id, "c2", path, parent_id="c1", metrics={"kl": 0.1},
                     samples=4, turn_ids=trained_on, read_at=read_at)
    assert record.status == "rejected" and not record.active
    assert store.active_checkpoint().id == "c1"
    assert store.get_checkpoint("c2").status == "rejected"
    done = store.get_run(run.id)
    assert done.status == "rejected"
    assert done.error == ("2 of the turns this round trained on were forgotten while it ran; "
                          "nothing was promoted")
    assert not path.exists()
    # a round whose turns are all still there is promoted as before
    run = store.start_run("test")
    record = store.promote(run.id, "c3", "/ckpt/c3", parent_id="c1", metrics={}, samples=2,
                           turn_ids=[kept.id, other.id], read_at=utcnow())
    assert record.active and store.get_run(run.id).status == "succeeded"


def test_open_refuses_a_damaged_database_before_migrating(tmp_path):
    """PRAGMA quick_check at start-up: a database with a garbage page is one StoreError
    naming the file and both fixes, not a 500 on the first query that reads the page."""
    from reinf.storage.db import DamagedDatabase
    from reinf.storage.store import Store

    path = tmp_path / "a.db"
    store = Store(f"sqlite:///{path}")
    conv = store.create_conversation().id
    for i in range(200):
        store.append_turn(conv, f"q{i} " * 50, f"a{i} " * 50)
    store.close()
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # a page in the middle: not the header, not the schema
        fh.seek((size // 4096 // 2) * 4096)
        fh.write(b"\xa5" * 4096)
    with pytest.raises(DamagedDatabase) as info:
        Store(f"sqlite:///{path}")
    assert str(path) in info.value.message and "damaged" in info.value.message
    assert "restore it from a backup" in info.value.fix and "reinf db recover" in info.value.fix
    assert info.value.status == 503


def test_export_puts_the_system_prompt_first_in_every_format(store):
    from reinf.storage.export import export_rows

    conv = store.create_conversation(system_prompt="Be terse.").id
    first = add_turn(store, conv, msg="q1", reply="a1")
    second = add_turn(store, conv, msg="q2", reply="a2")
    store.rate(first.id, 5)
    store.rate(second.id, 1)
    system = {"role": "system", "content": "Be terse."}
    raw = list(export_rows(store, "raw"))
    assert raw[1]["messages"] == [system, {"role": "user", "content": "q1"},
                                  {"role": "assistant", "content": "a1"},
                                  {"role": "user", "content": "q2"}]
    [sft] = export_rows(store, "sft")
    assert sft["messages"][0] == system and sft["messages"][1]["content"] == "q1"
    kto = list(export_rows(store, "kto"))
    assert len(kto) == 2 and all(row["prompt"][0] == system for row in kto)
    plain = add_turn(store, msg="q3")  # a conversation without one: no system message
    store.rate(plain.id, 4)
    assert list(export_rows(store, "raw"))[-1]["messages"] == [{"role": "user", "content": "q3"}]
