"""Forget removes data from every query and from the file; export formats."""
from __future__ import annotations

import json

import pytest

from reinf.errors import NotFound
from reinf.storage.export import export_rows

SECRET = "my-bank-pin-is-4921"


def chat(store, conv, msg, reply="ok", score=None):
    t = store.append_turn(conv, msg, reply, prompt_ids=[1, 2], reply_ids=[3, 4],
                          logprobs=[-1.0, -2.0])
    if score is not None:
        store.rate(t.id, score, tags=["wrong"] if score < 3 else [])
    return t


def every_query_text(store) -> str:
    parts = [r.to_dict() for r in store.history(limit=None)]
    parts += [s.prompt + s.response for s in store.training_samples(1000)]
    for fmt in ("raw", "sft", "kto"):
        parts += list(export_rows(store, fmt))
    parts += [c.to_dict() for c in store.list_conversations()]
    return json.dumps(parts, default=str)


def test_forget_turn_removes_it_everywhere_and_untrains_later_turns(store):
    conv = store.create_conversation().id
    keep = chat(store, conv, "first", score=4)
    secret = chat(store, conv, SECRET, score=5)
    later = chat(store, conv, "after", score=5)
    assert SECRET in every_query_text(store)
    result = store.forget_turn(secret.id)
    assert result == {"turns": 1, "ratings": 1, "later_turns_untrainable": 1}
    assert SECRET not in every_query_text(store)
    with pytest.raises(NotFound):
        store.get_turn(secret.id)
    # the later turn's prompt tokens contained the secret: never trained on again
    assert [s.turn_id for s in store.training_samples(100)] == [keep.id]
    assert store.get_turn(later.id).prompt_ids == []


def test_forget_conversation_and_all(store):
    a = store.create_conversation().id
    b = store.create_conversation().id
    chat(store, a, SECRET, score=1)
    chat(store, b, "other", score=5)
    assert store.forget_conversation(a) == {"conversations": 1, "turns": 1, "ratings": 1}
    assert SECRET not in every_query_text(store)
    assert store.counts()["turns"] == 1
    with pytest.raises(NotFound):
        store.forget_conversation(a)
    assert store.forget_all() == {"conversations": 1, "turns": 1, "ratings": 1}
    assert store.counts()["ratings"] == 0 and store.training_samples(10) == []


def test_forgotten_text_is_not_left_in_the_database_file(store, config):
    conv = store.create_conversation().id
    for i in range(20):
        chat(store, conv, f"{SECRET} #{i}", score=3)
    store.forget_all()
    store.close()
    raw = b"".join(p.read_bytes() for p in config.data_dir.glob("reinf.db*"))
    assert SECRET.encode() not in raw


def test_export_formats(store):
    conv = store.create_conversation().id
    good = chat(store, conv, "q1", "a1", score=5)
    chat(store, conv, "q2", "a2", score=3)
    chat(store, conv, "q3", "a3", score=1)
    chat(store, conv, "q4", "a4")  # unrated: never exported
    raw = list(export_rows(store, "raw"))
    assert [r["score"] for r in raw] == [5, 3, 1]
    assert raw[0]["turn_id"] == good.id and raw[0]["messages"] == [{"role": "user",
                                                                   "content": "q1"}]
    assert raw[2]["messages"][0] == {"role": "user", "content": "q1"}
    assert len(raw[2]["messages"]) == 5  # q1 a1 q2 a2 q3
    sft = list(export_rows(store, "sft"))
    assert sft == [{"messages": [{"role": "user", "content": "q1"},
                                 {"role": "assistant", "content": "a1"}]}]
    kto = list(export_rows(store, "kto"))
    assert [r["label"] for r in kto] == [True, False]  # the 3 is dropped
    assert kto[1]["completion"] == [{"role": "assistant", "content": "a3"}]
    assert kto[1]["prompt"][-1] == {"role": "user", "content": "q3"}


def test_reinf_forget_turn_takes_the_title_from_the_turn_left(store, invoke):
    conv = store.create_conversation().id
    first = chat(store, conv, f"{SECRET} is what I told you")
    chat(store, conv, "what is the weather like")
    assert SECRET in store.get_conversation(conv).title
    invoke("forget", "--turn", first.id)
    assert store.get_conversation(conv).title == "what is the weather like"
    assert SECRET not in every_query_text(store)


def test_export_gives_a_rewrite_as_the_reply_the_person_wanted(store):
    conv = store.create_conversation().id
    low = chat(store, conv, "q1", "a1", score=1)
    unrated = chat(store, conv, "q2", "a2")
    store.rewrite(low.id, "- a\n- b")
    store.rewrite(unrated.id, "better a2")
    raw = list(export_rows(store, "raw"))
    assert [(r["turn_id"], r["rewrite"]) for r in raw] == [(low.id, "- a\n- b")]  # rated only
    sft = list(export_rows(store, "sft"))
    assert [r["messages"][-1]["content"] for r in sft] == ["- a\n- b", "better a2"]
    assert sft[1]["messages"][-2] == {"role": "user", "content": "q2"}
    kto = list(export_rows(store, "kto"))
    assert [(r["completion"][0]["content"], r["label"]) for r in kto] == \
        [("- a\n- b", True), ("a1", False), ("better a2", True)]
