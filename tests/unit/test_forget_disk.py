"""Forgotten text leaves the disk: after each kind of forget, the raw bytes of reinf.db
and its -wal file (read while the store is still open, as under `reinf serve`) no longer
hold the forgotten text, nor does the conversation's title."""
from __future__ import annotations

import pytest

from webui_fakes import app, build_daemon, client, daemon, fake_chat  # noqa: F401 - fixtures

MARKER = "my secret SSN 123-45-6789 zq7-forget-marker"


def chat(store, conv, message, score=4):
    turn = store.append_turn(conv, message, "ok " * 40, prompt_ids=[1, 2], reply_ids=[3, 4],
                             logprobs=[-1.0, -2.0])
    store.rate(turn.id, score, tags=["wrong"], comment=f"about {message[:20]}")
    return turn


def on_disk(config) -> dict[str, bytes]:
    """The DB file and its WAL, byte for byte, while connections are open."""
    db = config.data_dir / "reinf.db"
    return {p.name: p.read_bytes() for p in (db, db.with_name("reinf.db-wal")) if p.exists()}


def holding(config, text: str) -> list[str]:
    return [name for name, raw in on_disk(config).items() if text.encode() in raw]


@pytest.fixture
def filled(store, config):
    """Padding conversations around one with the marker in its first, middle and last
    turn; the marker is also in the title (the first message)."""
    pad = store.create_conversation().id
    for i in range(15):  # enough rows that pages are reused, not just appended
        chat(store, pad, f"padding message {i} " + "x" * 300)
    conv = store.create_conversation().id
    first = chat(store, conv, f"{MARKER} first")
    middle = chat(store, conv, f"kept before {MARKER} middle " + "y" * 3000)  # overflow pages
    last = chat(store, conv, "a harmless last message")
    assert holding(config, MARKER)  # the test can see it before a forget
    return {"conv": conv, "first": first, "middle": middle, "last": last}


def test_forgetting_the_first_turn_removes_its_text_and_the_title_it_gave(store, config,
                                                                        filled):
    store.forget_turn(filled["middle"].id)  # so only the first turn holds the marker
    store.forget_turn(filled["first"].id)
    title = store.get_conversation(filled["conv"]).title
    assert MARKER not in title and title == "a harmless last message"
    assert all(MARKER not in c.title for c in store.list_conversations())
    assert holding(config, MARKER) == []


def test_forgetting_a_middle_turn_leaves_no_trace(store, config):
    conv = store.create_conversation().id
    chat(store, conv, "an opening line")
    middle = chat(store, conv, f"{MARKER} " + "z" * 5000)
    chat(store, conv, "a closing line")
    assert holding(config, MARKER)
    store.forget_turn(middle.id)
    assert store.get_conversation(conv).title == "an opening line"
    assert holding(config, MARKER) == []


def test_forgetting_the_only_turn_blanks_the_title(store, config):
    conv = store.create_conversation().id
    only = chat(store, conv, MARKER)
    store.forget_turn(only.id)
    assert store.get_conversation(conv).title == ""
    assert holding(config, MARKER) == []


def test_an_explicit_title_is_kept(store):
    conv = store.create_conversation(title="Holiday plans").id
    turn = chat(store, conv, "where shall we go")
    store.forget_turn(turn.id)
    assert store.get_conversation(conv).title == "Holiday plans"


def test_forgetting_a_conversation_leaves_no_trace(store, config, filled):
    store.forget_conversation(filled["conv"])
    assert holding(config, MARKER) == []
    assert holding(config, "padding message 3")  # the rest is still there


def test_forgetting_everything_leaves_no_trace(store, config, filled):
    store.forget_all()
    assert holding(config, MARKER) == []
    assert holding(config, "padding message 3") == []


def test_forget_over_the_api_rederives_the_title(config, store, client):
    conv = store.create_conversation().id
    first = chat(store, conv, MARKER)
    chat(store, conv, "the second question")
    assert client.delete(f"/api/turns/{first.id}").status_code == 200
    listed = client.get("/api/conversations").get_json()["conversations"]
    assert [c["title"] for c in listed] == ["the second question"]
    assert MARKER not in client.get(f"/api/conversations/{conv}").get_data(as_text=True)
    assert holding(config, MARKER) == []


def test_a_reader_holding_a_transaction_delays_the_wal_scrub_and_forget_says_so(store, config,
                                                                               filled, caplog):
    """Forget races: another program (a second sqlite3 connection) holds a read transaction,
    so wal_checkpoint(TRUNCATE) is busy. Forget does not wait the whole busy timeout, says
    that the text stays in the WAL until that reader finishes, and empties it later."""
    import sqlite3
    import time

    reader = sqlite3.connect(config.data_dir / "reinf.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM turns").fetchone()  # the read transaction
        started = time.monotonic()
        result = store.forget_conversation(filled["conv"])
        assert time.monotonic() - started < 5  # not the 15 s busy timeout
        assert result["turns"] == 3
        assert "another program is reading the database" in result["warning"]
        assert "stays in the write-ahead log" in result["warning"]
        assert "forgotten text is still in" in caplog.text
        assert store.wal_pending
        assert store.retry_scrub() is False  # still held
    finally:
        reader.execute("COMMIT")
        reader.close()
    assert store.retry_scrub() is True and not store.wal_pending  # the server's next tick
    assert holding(config, MARKER) == []
    assert "warning" not in store.forget_turn(store.history(limit=1)[0].id)
